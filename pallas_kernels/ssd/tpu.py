"""SSD kernels for TPUs: Pallas with the Mosaic TPU lowering. Tested in TPU interpret mode only.

Arrays as `gpu.py` takes them (time padded to a multiple of the chunk L, NC chunks): x, dy
`[B, T, H, P]`; dt and the log decays a = dt·A `[B, H, T]` float32; B, C `[B, T, G, N]`; doc
`[B, T]` int32 (`chunk_math`); states `[B, H, P, N]` float32; states at chunk boundaries
`[B, H, NC, P, N]` in the input dtype. A block's last two axes must be whole or
(8, 128)-aligned, so the kernels see views (`_View`): with P (N) a multiple of 128, x, dy
`[B, T, H·P]` (B, C `[B, T, G·N]`), whose head h (group g) is lane block h (g) of a time block
`(L, P)` (no transpose); with P = 64 (Mamba-2's head dim), x, dy head-major `[B, H, T, P]` (one
XLA transpose each way); the per-step vectors `[..., NC, 1, L]`, blocks `(1, L)` read as vectors
`[L]`. Cumulative sums are triangular float32 matmuls (Mosaic has no cumsum).
The same three kernels as `gpu.py`, the loop over chunks a sequential ("arbitrary") last grid
axis with the carried `[block_p, N]` float32 tile in VMEM scratch:

  forward      grid (B, H, P/block_p, NC): per chunk the within-chunk outputs (C·Bᵀ, decayed,
               times dt·x) plus the entering state read out by C, then the state update;
               optionally the tile entering each chunk (the backward's residual).
  state_grads  grid (B, H, P/backward_block_p, NC), chunks last to first: the gradient of the
               state leaving each chunk, and carry_c·⟨dH_c, S_c⟩ from the float32 dH.
  chunk_grads  grid (B, G, NC, H/G): the group's heads on a sequential last axis share the
               chunk's C·Bᵀ (VMEM scratch) and accumulate dB, dC in their resident output
               blocks; dx, dt's gradient through dt·x and the log decays' gradient per head.

The gradient formulas are `gpu.py`'s (its module docstring); only the loops became grid axes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.call import pallas_call
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.nha.layout import triangular_cumsum, triangular_reverse_cumsum
from pallas_kernels.ssd.block_sizes import Static
from pallas_kernels.ssd.chunk_math import F32, chunk_weights, pair_decay


def _params(num_axes: int):
    """Every grid axis parallel but the last (the chunks, or a group's heads)."""
    return pltpu.CompilerParams(dimension_semantics=("parallel",) * (num_axes - 1)
                                + ("arbitrary",))


def _interpret(st: Static):
    return pltpu.InterpretParams() if st.interpret else False


def _cumsum(v: jax.Array) -> jax.Array:
    return triangular_cumsum(v[:, None])[:, 0]


def _reverse_cumsum(v: jax.Array) -> jax.Array:
    return triangular_reverse_cumsum(v[:, None])[:, 0]


def _vector(ref) -> jax.Array:
    """The `[L]` vector of a `(1, L)` block."""
    return ref[0, :]


def _set_vector(ref, v: jax.Array):
    ref[...] = v[None, :]


def _by_chunk(v: jax.Array, L: int) -> jax.Array:
    """`[..., T]` -> `[..., NC, 1, L]` (the per-step vectors' layout in these kernels)."""
    return v.reshape(v.shape[:-1] + (v.shape[-1] // L, 1, L))


class _View:
    """How the kernels see a `[B, T, heads, d]` array: as `[B, T, heads·d]` (head h is lane
    block h: no transpose) when d is a multiple of the 128 lanes, else head-major
    `[B, heads, T, d]` (a `(L, d)` block then spans the whole last axis, as Mosaic requires)."""

    def __init__(self, d: int):
        self.d, self.lanes = d, d % 128 == 0

    def of(self, v: jax.Array) -> jax.Array:
        return v.reshape(v.shape[:2] + (-1,)) if self.lanes else v.transpose(0, 2, 1, 3)

    def shape(self, v: jax.Array) -> tuple[int, ...]:
        """The shape of `of(v)`."""
        batch, length, heads, d = v.shape
        return (batch, length, heads * d) if self.lanes else (batch, heads, length, d)

    def back(self, v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """`[B, T, heads, d]` from a kernel output in this view."""
        return v.reshape(shape) if self.lanes else v.transpose(0, 2, 1, 3)

    def seq(self, L: int, width: int, index) -> pl.BlockSpec:
        """Time block `(L, width)` of head `head`, feature tile `tile` (of `width` features);
        index maps the grid to (b, chunk, head, tile)."""
        tiles = self.d // width
        if self.lanes:
            return pl.BlockSpec((None, L, width), lambda *grid: (
                lambda b, c, head, tile: (b, c, head * tiles + tile))(*index(*grid)))
        return pl.BlockSpec((None, None, L, width), lambda *grid: (
            lambda b, c, head, tile: (b, head, c, tile))(*index(*grid)))


def _per_step(L: int, index) -> pl.BlockSpec:
    """Chunk `(1, L)` of a `[B, H, NC, 1, L]` vector; index maps the grid to (b, h, chunk)."""
    return pl.BlockSpec((None, None, None, 1, L), lambda *grid: (*index(*grid), 0, 0))


def _weights(a_ref, doc_ref):
    doc = None if doc_ref is None else _vector(doc_ref)
    return chunk_weights(_vector(a_ref), doc, _cumsum), doc


def _at_chunk(row: jax.Array, c, value) -> jax.Array:
    """`row` `[1, NC]` with entry c set to value (a lane mask, not a dynamic lane store)."""
    return jnp.where(lax.broadcasted_iota(jnp.int32, row.shape, 1) == c, value, row)


def _doc_spec(st: Static, L: int, index):
    """Chunk `(1, L)` of doc `[B, NC, 1, L]`; index maps the grid to (b, chunk)."""
    return ([pl.BlockSpec((None, None, 1, L), lambda *grid: (*index(*grid), 0, 0))]
            if st.documents else [])


def _doc_args(st: Static, doc):
    return (_by_chunk(doc, st.blocks.chunk),) if st.documents else ()


# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(*refs, st: Static, num_chunks: int, store_states: bool):
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc_ref = refs[5] if st.documents else None
    s0_ref, y_ref, final_ref = refs[5 + st.documents:8 + st.documents]
    states_ref = refs[8 + st.documents] if store_states else None
    state_ref = refs[-1]
    c = pl.program_id(3)
    dtype = x_ref.dtype  # matmul operands

    @pl.when(c == 0)
    def _():
        state_ref[...] = s0_ref[...]

    w, doc = _weights(a_ref, doc_ref)
    keys, queries, state = b_ref[...], c_ref[...], state_ref[...]
    u = x_ref[...].astype(F32) * _vector(dt_ref)[:, None]  # [L, block_p]
    scores = mm_nt(queries, keys) * pair_decay(w.cum, doc)
    y = mm(scores.astype(dtype), u.astype(dtype))
    y += w.into[:, None] * mm_nt(queries, state.astype(dtype))
    y_ref[...] = y.astype(y_ref.dtype)
    if store_states:
        states_ref[...] = state.astype(states_ref.dtype)
    state = w.carry * state + mm_tn((u * w.out[:, None]).astype(dtype), keys)
    state_ref[...] = state

    @pl.when(c == num_chunks - 1)
    def _():
        final_ref[...] = state


def forward(x, dt, a, B, C, doc, s0, st: Static, *, store_states: bool):
    """y `[B, T, H, P]` (x's dtype), the final state (float32) and, with `store_states`, the
    state entering every chunk `[B, H, NC, P, N]` (x's dtype)."""
    if st.blocks.split_forward:
        raise ValueError("the TPU SSD forward has no split form (BlockSizes.split_forward)")
    batch, length, heads, P = x.shape
    N = B.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.block_p, st.group
    num_chunks = length // L
    tiles = P // BP
    xv, bv = _View(P), _View(N)
    seq = xv.seq(L, BP, lambda b, h, p, c: (b, c, h, p))
    keys = bv.seq(L, N, lambda b, h, p, c: (b, c, h // group, 0))
    per_step = _per_step(L, lambda b, h, p, c: (b, h, c))
    tile = pl.BlockSpec((None, None, BP, N), lambda b, h, p, c: (b, h, p, 0))
    out_specs = [seq, tile]
    out_shape = [jax.ShapeDtypeStruct(xv.shape(x), x.dtype), jax.ShapeDtypeStruct(s0.shape, F32)]
    if store_states:
        out_specs.append(pl.BlockSpec((None, None, None, BP, N),
                                      lambda b, h, p, c: (b, h, c, p, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), x.dtype))
    y, *states = pallas_call(
        functools.partial(_forward_kernel, st=st, num_chunks=num_chunks,
                          store_states=store_states),
        grid=(batch, heads, tiles, num_chunks),
        in_specs=[seq, per_step, per_step, keys, keys,
                  *_doc_spec(st, L, lambda b, h, p, c: (b, c)), tile],
        out_specs=out_specs, out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((BP, N), F32)], compiler_params=_params(4),
        interpret=_interpret(st), name="ssd_forward",
    )(xv.of(x), _by_chunk(dt, L), _by_chunk(a, L), bv.of(B), bv.of(C), *_doc_args(st, doc), s0)
    return xv.back(y, x.shape), *states


# --- backward: the reverse pass over chunks ---------------------------------------------------


def _state_grads_kernel(*refs, st: Static, num_chunks: int):
    dy_ref, a_ref, c_ref = refs[:3]
    doc_ref = refs[3] if st.documents else None
    (states_ref, d_final_ref, d_states_ref, d_initial_ref, kept_ref,
     d_state_ref) = refs[3 + st.documents:]
    i = pl.program_id(3)
    chunk = num_chunks - 1 - i

    @pl.when(i == 0)
    def _():
        d_state_ref[...] = d_final_ref[...]
        kept_ref[...] = jnp.zeros(kept_ref.shape, F32)

    w, _ = _weights(a_ref, doc_ref)
    d_state = d_state_ref[...]  # the gradient of the state leaving this chunk
    d_states_ref[...] = d_state.astype(d_states_ref.dtype)
    # ⟨dH_c, carry·S_c⟩: the entering state's share of ∂L/∂cum_last (chunk_grads adds the
    # chunk's own writes), from the float32 dH.
    kept = w.carry * jnp.sum(d_state * states_ref[...].astype(F32))
    kept_ref[...] = _at_chunk(kept_ref[...], chunk, kept)
    pulled = (dy_ref[...].astype(F32) * w.into[:, None]).astype(d_states_ref.dtype)
    d_state = w.carry * d_state + mm_tn(pulled, c_ref[...])
    d_state_ref[...] = d_state

    @pl.when(i == num_chunks - 1)
    def _():
        d_initial_ref[...] = d_state


def state_grads(dy, a, C, doc, states, d_final, st: Static):
    """The gradient of the state leaving every chunk `[B, H, NC, P, N]` (dy's dtype), of the
    initial state `[B, H, P, N]` float32, and `carry_c·⟨dH_c, S_c⟩` per chunk `[B, H, 1, NC]`
    float32 (S_c: the stored state entering chunk c)."""
    batch, length, heads, P = dy.shape
    N = C.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.backward_block_p, st.group
    num_chunks, tiles = length // L, P // BP
    back = lambda c: num_chunks - 1 - c
    tile = pl.BlockSpec((None, None, BP, N), lambda b, h, p, c: (b, h, p, 0))
    boundary = pl.BlockSpec((None, None, None, BP, N), lambda b, h, p, c: (b, h, back(c), p, 0))
    xv, bv = _View(P), _View(N)
    in_specs = [xv.seq(L, BP, lambda b, h, p, c: (b, back(c), h, p)),
                _per_step(L, lambda b, h, p, c: (b, h, back(c))),
                bv.seq(L, N, lambda b, h, p, c: (b, back(c), h // group, 0)),
                *_doc_spec(st, L, lambda b, h, p, c: (b, back(c))), boundary, tile]
    d_states, d_initial, kept = pallas_call(
        functools.partial(_state_grads_kernel, st=st, num_chunks=num_chunks),
        grid=(batch, heads, tiles, num_chunks), in_specs=in_specs,
        out_specs=[boundary, tile, pl.BlockSpec((None, None, None, 1, num_chunks),
                                                lambda b, h, p, c: (b, h, p, 0, 0))],
        out_shape=[jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), dy.dtype),
                   jax.ShapeDtypeStruct(d_final.shape, F32),
                   jax.ShapeDtypeStruct((batch, heads, tiles, 1, num_chunks), F32)],
        scratch_shapes=[pltpu.VMEM((BP, N), F32)], compiler_params=_params(4),
        interpret=_interpret(st), name="ssd_state_grads",
    )(xv.of(dy), _by_chunk(a, L), bv.of(C), *_doc_args(st, doc), states, d_final)
    return d_states, d_initial, jnp.sum(kept, axis=2)


# --- backward: every chunk in parallel --------------------------------------------------------


def _chunk_grads_kernel(*refs, st: Static):
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc_ref = refs[5] if st.documents else None
    (dy_ref, states_ref, d_states_ref, kept_ref, dx_ref, ddt_ref, da_ref, db_ref, dc_ref,
     raw_ref) = refs[5 + st.documents:]
    c, r = pl.program_id(2), pl.program_id(3)
    keys, queries = b_ref[...], c_ref[...]  # [L, N], shared by the group's heads
    dtype = keys.dtype

    @pl.when(r == 0)
    def _():
        raw_ref[...] = mm_nt(queries, keys)  # C_t·B_s, [L, L]
        db_ref[...] = jnp.zeros(db_ref.shape, F32)
        dc_ref[...] = jnp.zeros(dc_ref.shape, F32)

    raw_scores = raw_ref[...]
    dt = _vector(dt_ref)
    w, doc = _weights(a_ref, doc_ref)
    decay = pair_decay(w.cum, doc)
    x, dy = x_ref[...], dy_ref[...]
    state, d_state = states_ref[...], d_states_ref[...]
    x32 = x.astype(F32)
    # D_ts = (dy_t·dt_s x_s) e^{cum_t − cum_s}: the gradient of the decayed scores.
    d_scores = mm_nt(dy, x) * (decay * dt[None, :])
    products = d_scores * raw_scores  # ∂L/∂cum through the pairs: rows minus columns
    d_cum = jnp.sum(products, axis=1) - jnp.sum(products, axis=0)
    d_scores = d_scores.astype(dtype)
    via_pairs = mm_tn((raw_scores * decay).astype(dtype), dy)
    via_state = w.out[:, None] * mm_nt(keys, d_state)  # du via the leaving state
    state_pull = jnp.sum(x32 * via_state, axis=1)
    pull = dt * state_pull  # out_s u_s·(dH B_s) = B_s·dB_s via that state
    _set_vector(ddt_ref, jnp.sum(x32 * via_pairs, axis=1) + state_pull)
    dx_ref[...] = ((via_pairs + via_state) * dt[:, None]).astype(dx_ref.dtype)
    through_entry = w.into[:, None] * mm(dy, state)  # dC via the entering state
    d_cum += jnp.sum(queries.astype(F32) * through_entry, axis=1)
    dc_ref[...] += mm(d_scores, keys) + through_entry
    db_ref[...] += mm_tn(d_scores, queries) + (w.out * dt)[:, None] * mm(x, d_state)
    # The leaving state S' = carry·S + Σ_s out_s u_s B_sᵀ adds ⟨dH, S'⟩ at the last step: its
    # first part came from the reverse pass (`kept`, entry c of this head's row).
    kept = jnp.sum(jnp.where(lax.broadcasted_iota(jnp.int32, kept_ref.shape, 1) == c,
                             kept_ref[...], 0.0))
    _set_vector(da_ref, _reverse_cumsum(d_cum - pull) + (kept + jnp.sum(pull)))


def chunk_grads(x, dt, a, B, C, doc, dy, states, d_states, kept, st: Static):
    """Gradients `(dx, d dt, d a, dB, dC)`: dx in x's dtype; d dt (through dt·x only) and d a
    `[B, H, T]` float32; dB, dC `[B, T, G, N]` float32. `kept`: `state_grads`' third output."""
    batch, length, heads, P = x.shape
    groups, N = B.shape[2:]
    L, R = st.blocks.chunk, st.group
    num_chunks = length // L
    head = lambda g, r: g * R + r
    xv, bv = _View(P), _View(N)
    seq = xv.seq(L, P, lambda b, g, c, r: (b, c, head(g, r), 0))
    per_step = _per_step(L, lambda b, g, c, r: (b, head(g, r), c))
    keys = bv.seq(L, N, lambda b, g, c, r: (b, c, g, 0))
    boundary = pl.BlockSpec((None, None, None, P, N),
                            lambda b, g, c, r: (b, head(g, r), c, 0, 0))
    per_head = jax.ShapeDtypeStruct((batch, heads, num_chunks, 1, L), F32)
    dx, d_dt, d_a, dB, dC = pallas_call(
        functools.partial(_chunk_grads_kernel, st=st),
        grid=(batch, groups, num_chunks, R),
        in_specs=[seq, per_step, per_step, keys, keys,
                  *_doc_spec(st, L, lambda b, g, c, r: (b, c)), seq, boundary, boundary,
                  pl.BlockSpec((None, None, 1, num_chunks),
                               lambda b, g, c, r: (b, head(g, r), 0, 0))],
        out_specs=[seq, per_step, per_step, keys, keys],
        out_shape=[jax.ShapeDtypeStruct(xv.shape(x), x.dtype), per_head, per_head,
                   jax.ShapeDtypeStruct(bv.shape(B), F32), jax.ShapeDtypeStruct(bv.shape(C), F32)],
        scratch_shapes=[pltpu.VMEM((L, L), F32)], compiler_params=_params(4),
        interpret=_interpret(st), name="ssd_chunk_grads",
    )(xv.of(x), _by_chunk(dt, L), _by_chunk(a, L), bv.of(B), bv.of(C), *_doc_args(st, doc),
      xv.of(dy), states, d_states, kept)
    return (xv.back(dx, x.shape), d_dt.reshape(dt.shape), d_a.reshape(a.shape),
            bv.back(dB, B.shape), bv.back(dC, C.shape))
