"""SSD kernels for NVIDIA GPUs: Pallas with the Triton lowering (NOTES.md says why).

Arrays (time padded to a multiple of the chunk L, NC chunks): x, dy `[B, T, H, P]`; dt and the
log decays a = dt·A `[B, H, T]` float32; B, C `[B, T, G, N]`; doc `[B, T]` int32 (document
starts so far within each chunk, `chunk_math`); states `[B, H, P, N]` float32; states at chunk
boundaries `[B, H, NC, P, N]` in the input dtype (the matmul operand type).

  forward      grid (B, H, P/block_p): one program carries a `[block_p, N]` state tile in
               registers through a loop over all chunks; per chunk it writes the chunk's output
               (within-chunk scores C·Bᵀ, decayed, times dt·x, plus the entering state read
               out by C) and updates the tile; optionally it stores the tile entering each
               chunk (the backward's residual). Nothing else of the state reaches HBM.
  state_grads  grid (B, H, P/backward_block_p): the reverse loop over chunks, the gradient of
               the state leaving each chunk (dH_c = e^{cum_last} dH_{c+1} + Σ_t e^{cum_t} dy_t
               C_tᵀ).
  chunk_grads  grid (B, G, NC): every chunk in parallel; a loop over the group's heads shares
               the chunk's C·Bᵀ and accumulates dB, dC in registers; dx, dt's gradient through
               dt·x, and the log decays' gradient per step.

Gradient of the log decays: with every weight e^{±cum}, ∂L/∂cum_t = C_t·dC_t − B_t·dB_t (this
head's parts) + [t = last]·⟨dH, S_next⟩; its within-chunk part is summed from the `[L, L]`
products in float32 (rows minus columns), not from the rounded dB, dC, because the reverse
cumulative sum over the chunk subtracts nearly equal numbers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.call import pallas_call
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.ssd.block_sizes import BlockSizes
from pallas_kernels.ssd.chunk_math import F32, chunk_weights, pair_decay, reverse_cumsum


@dataclasses.dataclass(frozen=True)
class Static:
    """The static part of one call (hashable: a `custom_vjp` nondiff argument).

    group: heads per B/C group (H/G); documents: doc is passed (packed documents).
    """

    blocks: BlockSizes
    group: int
    documents: bool
    interpret: bool


def _params(num_warps: int, num_stages: int):
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _doc_args(st: Static, doc):
    return (doc,) if st.documents else ()


def _chunk_loop(num_chunks: int, load, body, init, *, reverse: bool = False):
    """`lax.fori_loop` over the chunks (last to first with `reverse`) carrying a state. Each
    step issues `load(next chunk)` (the per-step vectors) before `body(chunk, loaded, state)`
    runs, so those small loads' latency overlaps a chunk's work instead of stalling each step
    of the serial loop (the larger matmul operands are left to Triton's pipelining)."""
    order = (lambda i: num_chunks - 1 - i) if reverse else (lambda i: i)

    def step(i, carry):
        state, loaded = carry
        ahead = load(order(jnp.minimum(i + 1, num_chunks - 1)))
        return body(order(i), loaded, state), ahead

    return lax.fori_loop(0, num_chunks, step, (init, load(order(0))))[0]


def _vector_loader(L: int, *refs):
    """The per-step vectors `[L]` of chunk c of each ref (None stays None)."""
    return lambda c: tuple(None if ref is None else ref[pl.ds(c * L, L)] for ref in refs)


# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(*refs, st: Static, num_chunks: int, store_states: bool):
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc_ref = refs[5] if st.documents else None
    s0_ref, y_ref, final_ref = refs[5 + st.documents:8 + st.documents]
    states_ref = refs[-1] if store_states else None
    L = st.blocks.chunk
    dtype = x_ref.dtype  # matmul operands

    def chunk(c, vectors, state):
        dt, a, doc = vectors
        rows = pl.ds(c * L, L)
        w = chunk_weights(a, doc)
        keys, queries = b_ref[rows, :], c_ref[rows, :]
        u = x_ref[rows, :].astype(F32) * dt[:, None]  # [L, block_p]
        scores = mm_nt(queries, keys) * pair_decay(w.cum, doc)
        y = mm(scores.astype(dtype), u.astype(dtype))
        y += w.into[:, None] * mm_nt(queries, state.astype(dtype))
        y_ref[rows, :] = y.astype(y_ref.dtype)
        if store_states:
            states_ref[c] = state.astype(states_ref.dtype)
        return w.carry * state + mm_tn((u * w.out[:, None]).astype(dtype), keys)

    final_ref[...] = _chunk_loop(num_chunks, _vector_loader(L, dt_ref, a_ref, doc_ref), chunk,
                                 s0_ref[...])


def forward(x, dt, a, B, C, doc, s0, st: Static, *, store_states: bool):
    """y `[B, T, H, P]` (x's dtype), the final state (float32) and, with `store_states`, the
    state entering every chunk `[B, H, NC, P, N]` (x's dtype)."""
    batch, length, heads, P = x.shape
    N = B.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.block_p, st.group
    num_chunks = length // L
    seq = lambda d: pl.BlockSpec((None, length, None, d), lambda b, h, p: (b, 0, h, p))
    keys = pl.BlockSpec((None, length, None, N), lambda b, h, p: (b, 0, h // group, 0))
    per_step = pl.BlockSpec((None, None, length), lambda b, h, p: (b, h, 0))
    tile = pl.BlockSpec((None, None, BP, N), lambda b, h, p: (b, h, p, 0))
    in_specs = [seq(BP), per_step, per_step, keys, keys]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, length), lambda b, h, p: (b, 0)))
    out_specs = [seq(BP), tile]
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(s0.shape, F32)]
    if store_states:
        out_specs.append(pl.BlockSpec((None, None, num_chunks, BP, N),
                                      lambda b, h, p: (b, h, 0, p, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), x.dtype))
    return pallas_call(
        functools.partial(_forward_kernel, st=st, num_chunks=num_chunks,
                          store_states=store_states),
        grid=(batch, heads, P // BP), in_specs=in_specs + [tile], out_specs=out_specs,
        out_shape=out_shape, compiler_params=_params(st.blocks.num_warps, st.blocks.num_stages),
        interpret=st.interpret, name="ssd_forward",
    )(x, dt, a, B, C, *_doc_args(st, doc), s0)


# --- backward: the reverse pass over chunks ---------------------------------------------------


def _state_grads_kernel(*refs, st: Static, num_chunks: int):
    dy_ref, a_ref, c_ref = refs[:3]
    doc_ref = refs[3] if st.documents else None
    d_final_ref, d_states_ref, d_initial_ref = refs[3 + st.documents:]
    L = st.blocks.chunk
    dtype = d_states_ref.dtype

    def chunk(c, vectors, d_state):
        rows = pl.ds(c * L, L)
        w = chunk_weights(*vectors)
        d_states_ref[c] = d_state.astype(dtype)  # the gradient of the state leaving chunk c
        pulled = (dy_ref[rows, :].astype(F32) * w.into[:, None]).astype(dtype)
        return w.carry * d_state + mm_tn(pulled, c_ref[rows, :])

    d_initial_ref[...] = _chunk_loop(num_chunks, _vector_loader(L, a_ref, doc_ref), chunk,
                                     d_final_ref[...], reverse=True)


def state_grads(dy, a, C, doc, d_final, st: Static):
    """The gradient of the state leaving every chunk `[B, H, NC, P, N]` (dy's dtype) and of
    the initial state `[B, H, P, N]` float32."""
    batch, length, heads, P = dy.shape
    N = C.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.backward_block_p, st.group
    num_chunks = length // L
    tile = pl.BlockSpec((None, None, BP, N), lambda b, h, p: (b, h, p, 0))
    in_specs = [pl.BlockSpec((None, length, None, BP), lambda b, h, p: (b, 0, h, p)),
                pl.BlockSpec((None, None, length), lambda b, h, p: (b, h, 0)),
                pl.BlockSpec((None, length, None, N), lambda b, h, p: (b, 0, h // group, 0))]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, length), lambda b, h, p: (b, 0)))
    return pallas_call(
        functools.partial(_state_grads_kernel, st=st, num_chunks=num_chunks),
        grid=(batch, heads, P // BP), in_specs=in_specs + [tile],
        out_specs=[pl.BlockSpec((None, None, num_chunks, BP, N), lambda b, h, p: (b, h, 0, p, 0)),
                   tile],
        out_shape=[jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), dy.dtype),
                   jax.ShapeDtypeStruct(d_final.shape, F32)],
        compiler_params=_params(st.blocks.backward_num_warps, st.blocks.backward_num_stages),
        interpret=st.interpret, name="ssd_state_grads",
    )(dy, a, C, *_doc_args(st, doc), d_final)


# --- backward: every chunk in parallel --------------------------------------------------------


def _chunk_grads_kernel(*refs, st: Static):
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc_ref = refs[5] if st.documents else None
    (dy_ref, states_ref, d_states_ref, dx_ref, ddt_ref, da_ref, db_ref,
     dc_ref) = refs[5 + st.documents:]
    keys, queries = b_ref[...], c_ref[...]  # [L, N], shared by the group's heads
    dtype = keys.dtype
    doc = None if doc_ref is None else doc_ref[...]
    raw_scores = mm_nt(queries, keys)  # C_t·B_s, [L, L]
    P = x_ref.shape[-1]
    BP = st.blocks.grads_block_p
    tiles = [pl.ds(p * BP, BP) for p in range(P // BP)]

    def head(r, grads):
        d_queries, d_keys = grads
        dt = dt_ref[r, :]
        w = chunk_weights(a_ref[r, :], doc)
        decay = pair_decay(w.cum, doc)
        scores = (raw_scores * decay).astype(dtype)
        u = lambda cols: (x_ref[:, r, cols].astype(F32) * dt[:, None]).astype(dtype)
        # D_ts = (dy_t·u_s) e^{cum_t − cum_s}: the gradient of the decayed scores.
        d_scores = sum(mm_nt(dy_ref[:, r, cols], u(cols)) for cols in tiles) * decay
        products = d_scores * raw_scores  # ∂L/∂cum through the pairs: rows minus columns
        d_cum = jnp.sum(products, axis=1) - jnp.sum(products, axis=0)
        d_scores = d_scores.astype(dtype)
        d_queries += mm(d_scores, keys)
        d_keys += mm_tn(d_scores, queries)
        d_dt = inner = keys_pull = 0.0
        # Each tile's state products are folded into the accumulators and into ∂L/∂cum at
        # once (short live ranges: the float32 [L, N] tiles are the registers' main load).
        for cols in tiles:
            dy = dy_ref[:, r, cols]
            state, d_state = states_ref[r, cols, :], d_states_ref[r, cols, :]
            du = mm_tn(scores, dy) + w.out[:, None] * mm_nt(keys, d_state)
            dx_ref[:, r, cols] = (du * dt[:, None]).astype(dx_ref.dtype)
            d_dt += jnp.sum(du * x_ref[:, r, cols].astype(F32), axis=1)
            through_entry = w.into[:, None] * mm(dy, state)  # dC via the entering state
            d_cum += jnp.sum(queries.astype(F32) * through_entry, axis=1)
            d_queries += through_entry
            through_exit = w.out[:, None] * mm(u(cols), d_state)  # dB via the leaving state
            keys_pull += jnp.sum(keys.astype(F32) * through_exit, axis=1)
            d_keys += through_exit
            inner += jnp.sum(d_state.astype(F32) * state.astype(F32))
        # The leaving state S' = carry·S + Σ_s out_s u_s B_sᵀ adds ⟨dH, S'⟩ at the last step.
        d_last = w.carry * inner + jnp.sum(keys_pull)
        ddt_ref[r, :] = d_dt
        da_ref[r, :] = reverse_cumsum(d_cum - keys_pull) + d_last
        return d_queries, d_keys

    zeros = jnp.zeros(keys.shape, F32)
    d_queries, d_keys = lax.fori_loop(0, st.group, head, (zeros, zeros))
    dc_ref[...] = d_queries
    db_ref[...] = d_keys


def chunk_grads(x, dt, a, B, C, doc, dy, states, d_states, st: Static):
    """Gradients `(dx, d dt, d a, dB, dC)`: dx in x's dtype; d dt (through dt·x only) and
    d a `[B, H, T]` float32; dB, dC `[B, T, G, N]` float32."""
    batch, length, heads, P = x.shape
    groups, N = B.shape[2:]
    L, R = st.blocks.chunk, st.group
    heads_of = lambda d: pl.BlockSpec((None, L, R, d), lambda b, g, c: (b, c, g, 0))
    per_step = pl.BlockSpec((None, R, L), lambda b, g, c: (b, g, c))
    keys = pl.BlockSpec((None, L, None, N), lambda b, g, c: (b, c, g, 0))
    boundary = pl.BlockSpec((None, R, None, P, N), lambda b, g, c: (b, g, c, 0, 0))
    in_specs = [heads_of(P), per_step, per_step, keys, keys]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, L), lambda b, g, c: (b, c)))
    per_head = jax.ShapeDtypeStruct((batch, heads, length), F32)
    return pallas_call(
        functools.partial(_chunk_grads_kernel, st=st),
        grid=(batch, groups, length // L),
        in_specs=in_specs + [heads_of(P), boundary, boundary],
        out_specs=[heads_of(P), per_step, per_step, keys, keys],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype), per_head, per_head,
                   jax.ShapeDtypeStruct(B.shape, F32), jax.ShapeDtypeStruct(C.shape, F32)],
        compiler_params=_params(st.blocks.grads_num_warps, st.blocks.grads_num_stages),
        interpret=st.interpret, name="ssd_chunk_grads",
    )(x, dt, a, B, C, *_doc_args(st, doc), dy, states, d_states)
