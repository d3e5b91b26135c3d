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
               With `split_forward` the within-chunk part comes from `chunk_outputs` (grid
               (B, G, NC), every chunk in parallel) and the loop only adds the readout.
  state_grads  grid (B, H, P/backward_block_p, N/backward_block_n): the reverse loop over
               chunks, the gradient of the state leaving each chunk (dH_c = e^{cum_last}
               dH_{c+1} + Σ_t e^{cum_t} dy_t C_tᵀ), and carry_c·⟨dH_c, S_c⟩ from the float32
               dH (the log decays' chunk-end term, so chunk_grads never forms the `[P, N]`
               product).
  chunk_grads  grid (B, G, NC): every chunk in parallel; a loop over the group's heads shares
               the chunk's C·Bᵀ and accumulates dB, dC in registers; dx, dt's gradient through
               dt·x, and the log decays' gradient per step. With `grads_summed_scores` the loop
               sums the heads' score gradients, multiplied by B and C once after it, and XLA
               makes C·Bᵀ and the log decays' within-chunk sums (NOTES.md session 18).

Gradient of the log decays: with every weight e^{±cum}, ∂L/∂cum_t = C_t·dC_t − B_t·dB_t (this
head's parts) + [t = last]·⟨dH, S_next⟩; its within-chunk part is summed from the `[L, L]`
products in float32 (rows minus columns), not from the rounded dB, dC, because the reverse
cumulative sum over the chunk subtracts nearly equal numbers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.chunk_sums import chunk_cumsum
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.ssd.block_sizes import Static
from pallas_kernels.ssd.chunk_math import F32, chunk_weights, pair_decay, reverse_cumsum


def _doc_args(st: Static, doc):
    return (doc,) if st.documents else ()


def _chunk_loop(num_chunks: int, load, body, init, *, reverse: bool = False,
                ahead: bool = True):
    """`lax.fori_loop` over the chunks (last to first with `reverse`) carrying a state. Each
    step issues `load(next chunk)` (the per-step vectors) before `body(chunk, loaded, state)`
    runs, so those small loads' latency overlaps a chunk's work instead of stalling each step
    of the serial loop (the larger matmul operands are left to Triton's pipelining).

    Without `ahead` each step loads its own vectors: Triton's pipeliner then issues them as
    `cp.async` with the tiles, `num_stages - 1` steps ahead. (A step ahead through registers is
    less than it seems: ptxas copies the loop-carried registers at the step's end, which waits
    for that step's loads, NOTES.md round 7.)"""
    order = (lambda i: num_chunks - 1 - i) if reverse else (lambda i: i)
    if not ahead:
        return lax.fori_loop(0, num_chunks, lambda i, state: body(order(i), load(order(i)), state),
                             init)

    def step(i, carry):
        state, loaded = carry
        ahead = load(order(jnp.minimum(i + 1, num_chunks - 1)))
        return body(order(i), loaded, state), ahead

    return lax.fori_loop(0, num_chunks, step, (init, load(order(0))))[0]


def _vector_loader(L: int, *refs):
    """The per-step vectors `[L]` of chunk c of each ref (None stays None)."""
    return lambda c: tuple(None if ref is None else ref[pl.ds(c * L, L)] for ref in refs)


def _decay_loader(st: Static, L: int, dt_ref, a_ref, doc_ref):
    """`(dt, a, doc, total)` of chunk c; with `cumulative_decay` `a` is the chunk's inclusive
    cumulative log decay (made by XLA, `chunk_sums.chunk_cumsum`) and `total` its last entry,
    else None."""
    vectors = _vector_loader(L, dt_ref, a_ref, doc_ref)
    if not st.blocks.cumulative_decay:
        return lambda c: vectors(c) + (None,)
    return lambda c: vectors(c) + (jnp.sum(a_ref[pl.ds(c * L + L - 1, 1)]),)


# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(*refs, st: Static, num_chunks: int, store_states: bool, with_skip: bool):
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc_ref = refs[5] if st.documents else None
    split = st.blocks.split_forward
    local_ref = refs[5 + st.documents] if split else None
    skip_ref = refs[5 + st.documents + split] if with_skip else None
    first = 5 + st.documents + split + with_skip
    s0_ref, y_ref, final_ref = refs[first:first + 3]
    states_ref = refs[-1] if store_states else None
    L = st.blocks.chunk
    dtype = x_ref.dtype  # matmul operands

    def chunk(c, vectors, state):
        dt, a, doc, total = vectors
        rows = pl.ds(c * L, L)
        w = chunk_weights(a, doc, total=total)
        # `decays_first`: the pair decays (the step's exponentials) come before the chunk's
        # first tile read, so ptxas issues them while C·Bᵀ runs on the tensor cores.
        decay = pair_decay(w.cum, doc) if st.blocks.decays_first and not split else None
        keys, queries = b_ref[rows, :], c_ref[rows, :]
        x = x_ref[rows, :].astype(F32)  # [L, block_p]
        u = x * dt[:, None]
        if split:  # the within-chunk part came from `chunk_outputs`
            y = local_ref[rows, :].astype(F32)
        else:
            scores = mm_nt(queries, keys)
            scores *= pair_decay(w.cum, doc) if decay is None else decay
            y = mm(scores.astype(dtype), u.astype(dtype))
        y += w.into[:, None] * mm_nt(queries, state.astype(dtype))
        if with_skip:  # Mamba-2's D·x, added before y's one rounding
            y += jnp.sum(skip_ref[...]) * x
        y_ref[rows, :] = y.astype(y_ref.dtype)
        if store_states:
            states_ref[c] = state.astype(states_ref.dtype)
        return w.carry * state + mm_tn((u * w.out[:, None]).astype(dtype), keys)

    final_ref[...] = _chunk_loop(num_chunks, _decay_loader(st, L, dt_ref, a_ref, doc_ref), chunk,
                                 s0_ref[...])


def _chunk_states_kernel(*refs, st: Static, num_chunks: int):
    x_ref, dt_ref, a_ref, b_ref = refs[:4]
    doc_ref = refs[4] if st.documents else None
    s0_ref, final_ref, states_ref = refs[4 + st.documents:]
    L = st.blocks.chunk
    dtype = x_ref.dtype

    def chunk(c, vectors, state):
        dt, a, doc, total = vectors
        rows = pl.ds(c * L, L)
        w = chunk_weights(a, doc, total=total)
        states_ref[c] = state.astype(states_ref.dtype)  # stored before the product (GDN R12)
        u = (x_ref[rows, :].astype(F32) * (dt * w.out)[:, None]).astype(dtype)
        return w.carry * state + mm_tn(u, b_ref[rows, :])

    final_ref[...] = _chunk_loop(num_chunks, _decay_loader(st, L, dt_ref, a_ref, doc_ref), chunk,
                                 s0_ref[...], ahead=not st.blocks.state_vectors_in_step)


def chunk_states(x, dt, a, B, doc, s0, st: Static):
    """`BlockSizes.state_pass`: the serial loop carrying only the state. Returns the state
    entering every chunk `[B, H, NC, P, N]` (x's dtype) and the final state (float32)."""
    batch, length, heads, P = x.shape
    N = B.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.block_p, st.group
    BN = min(st.blocks.state_block_n or N, N)  # state columns per program (fla: 64)
    num_chunks = length // L
    per_step = pl.BlockSpec((None, None, length), lambda b, h, p, n: (b, h, 0))
    tile = pl.BlockSpec((None, None, BP, BN), lambda b, h, p, n: (b, h, p, n))
    in_specs = [pl.BlockSpec((None, length, None, BP), lambda b, h, p, n: (b, 0, h, p)),
                per_step, per_step,
                pl.BlockSpec((None, length, None, BN), lambda b, h, p, n: (b, 0, h // group, n))]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, length), lambda b, h, p, n: (b, 0)))
    final, states = pallas_call(
        functools.partial(_chunk_states_kernel, st=st, num_chunks=num_chunks),
        grid=(batch, heads, P // BP, N // BN), in_specs=in_specs + [tile],
        out_specs=[tile, pl.BlockSpec((None, None, num_chunks, BP, BN),
                                      lambda b, h, p, n: (b, h, 0, p, n))],
        out_shape=[jax.ShapeDtypeStruct(s0.shape, F32),
                   jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), x.dtype)],
        compiler_params=triton_params(st.blocks.num_warps, st.blocks.num_stages),
        interpret=st.interpret, name="ssd_chunk_states",
    )(x, dt, a, B, *_doc_args(st, doc), s0)
    return states, final


def forward(x, dt, a, B, C, doc, s0, st: Static, *, store_states: bool, skip=None):
    """y `[B, T, H, P]` (x's dtype), the final state (float32) and, with `store_states`, the
    state entering every chunk `[B, H, NC, P, N]` (x's dtype). With `split_forward` the
    within-chunk outputs come first from `chunk_outputs` (every chunk in parallel), and the
    loop over chunks only reads the entering state out and updates it. `skip` `[H]` float32
    (Mamba-2's D), or None: y_t + skip_h·x_t, added by the kernel that writes y."""
    batch, length, heads, P = x.shape
    N = B.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.block_p, st.group
    num_chunks = length // L
    if st.blocks.cumulative_decay:
        a = chunk_cumsum(a, L)
    if st.blocks.state_pass:
        states, final = chunk_states(x, dt, a, B, doc, s0, st)
        y = chunk_outputs(x, dt, a, B, C, doc, st, states=states, skip=skip)
        return (y, final, states) if store_states else (y, final)
    seq = lambda d: pl.BlockSpec((None, length, None, d), lambda b, h, p: (b, 0, h, p))
    keys = pl.BlockSpec((None, length, None, N), lambda b, h, p: (b, 0, h // group, 0))
    per_step = pl.BlockSpec((None, None, length), lambda b, h, p: (b, h, 0))
    tile = pl.BlockSpec((None, None, BP, N), lambda b, h, p: (b, h, p, 0))
    in_specs = [seq(BP), per_step, per_step, keys, keys]
    local = ()
    if st.documents:
        in_specs.append(pl.BlockSpec((None, length), lambda b, h, p: (b, 0)))
    if st.blocks.split_forward:
        local = (chunk_outputs(x, dt, a, B, C, doc, st),)
        in_specs.append(seq(BP))
    skips = ()
    if skip is not None:
        skips = (skip.reshape(heads, 1),)
        in_specs.append(pl.BlockSpec((None, 1), lambda b, h, p: (h, 0)))
    out_specs = [seq(BP), tile]
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(s0.shape, F32)]
    if store_states:
        out_specs.append(pl.BlockSpec((None, None, num_chunks, BP, N),
                                      lambda b, h, p: (b, h, 0, p, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), x.dtype))
    return pallas_call(
        functools.partial(_forward_kernel, st=st, num_chunks=num_chunks,
                          store_states=store_states, with_skip=skip is not None),
        grid=(batch, heads, P // BP), in_specs=in_specs + [tile], out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=triton_params(st.blocks.num_warps, st.blocks.num_stages),
        interpret=st.interpret, name="ssd_forward",
    )(x, dt, a, B, C, *_doc_args(st, doc), *local, *skips, s0)


def _chunk_outputs_kernel(*refs, st: Static, with_states: bool, with_skip: bool):
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc = refs[5][...] if st.documents else None
    states_ref = refs[5 + st.documents] if with_states else None
    skip_ref = refs[5 + st.documents + with_states] if with_skip else None
    y_ref = refs[-1]
    raw_scores = mm_nt(c_ref[...], b_ref[...])  # C_t·B_s, shared by the group's heads
    L = raw_scores.shape[0]

    def head(r, carry):
        dt = dt_ref[r, :]
        total = jnp.sum(a_ref[r, pl.ds(L - 1, 1)]) if st.blocks.cumulative_decay else None
        w = chunk_weights(a_ref[r, :], doc, total=total)
        decay = pair_decay(w.cum, doc)
        # scores_ts dt_s: dt scales the columns, so x is the operand as loaded.
        scores = (raw_scores * (decay * dt[None, :])).astype(x_ref.dtype)
        x = x_ref[:, r, :]
        y = mm(scores, x)
        if with_states:  # the entering state read out: e^{cum_t} C_t·S (`state_pass`)
            y += w.into[:, None] * mm_nt(c_ref[...], states_ref[r])
        if with_skip:  # Mamba-2's D·x, added before y's one rounding
            y += jnp.sum(skip_ref[pl.ds(r, 1)]) * x.astype(F32)
        y_ref[:, r, :] = y.astype(y_ref.dtype)
        return carry

    lax.fori_loop(0, st.group, head, 0)


def chunk_outputs(x, dt, a, B, C, doc, st: Static, states=None, skip=None):
    """Each chunk's outputs from its own inputs only, Σ_{s ≤ t} (C_t·B_s) e^{cum_t − cum_s}
    dt_s x_s, `[B, T, H, P]` in x's dtype: every (batch, group, chunk) in parallel, a loop
    over the group's heads sharing C·Bᵀ. With `states` (`state_pass`: the state entering
    every chunk, `[B, H, NC, P, N]`) plus its readout e^{cum_t} C_t·S: the whole output,
    and then with `skip` (`[H]` float32) plus skip_h·x_t."""
    if skip is not None and states is None:
        raise ValueError("chunk_outputs adds the skip only to the whole output (with states)")
    batch, length, heads, P = x.shape
    groups, N = B.shape[2:]
    L, R = st.blocks.chunk, st.group
    heads_of = pl.BlockSpec((None, L, R, P), lambda b, g, c: (b, c, g, 0))
    per_step = pl.BlockSpec((None, R, L), lambda b, g, c: (b, g, c))
    keys = pl.BlockSpec((None, L, None, N), lambda b, g, c: (b, c, g, 0))
    in_specs = [heads_of, per_step, per_step, keys, keys]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, L), lambda b, g, c: (b, c)))
    if states is not None:  # `[B, H, NC, P, N]`: the group's heads at chunk c
        in_specs.append(pl.BlockSpec((None, R, None, P, N), lambda b, g, c: (b, g, c, 0, 0)))
    skips = ()
    if skip is not None:  # `[G, R]`: the group's heads
        skips = (skip.reshape(groups, R),)
        in_specs.append(pl.BlockSpec((None, R), lambda b, g, c: (g, 0)))
    return pallas_call(
        functools.partial(_chunk_outputs_kernel, st=st, with_states=states is not None,
                          with_skip=skip is not None),
        grid=(batch, groups, length // L), in_specs=in_specs, out_specs=heads_of,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=triton_params(st.blocks.local_num_warps, st.blocks.local_num_stages),
        interpret=st.interpret, name="ssd_chunk_outputs",
    )(x, dt, a, B, C, *_doc_args(st, doc), *(() if states is None else (states,)), *skips)


# --- backward: the reverse pass over chunks ---------------------------------------------------


def _state_grads_kernel(*refs, st: Static, num_chunks: int):
    dy_ref, a_ref, c_ref = refs[:3]
    doc_ref = refs[3] if st.documents else None
    states_ref, d_final_ref, d_states_ref, d_initial_ref, kept_ref = refs[3 + st.documents:]
    L = st.blocks.chunk
    dtype = d_states_ref.dtype
    vectors = _vector_loader(L, a_ref, doc_ref)

    def chunk(c, loaded, d_state):
        rows = pl.ds(c * L, L)
        state, (a, doc) = loaded
        w = chunk_weights(a, doc)
        d_states_ref[c] = d_state.astype(dtype)  # the gradient of the state leaving chunk c
        # ⟨dH_c, carry·S_c⟩: the entering state's share of ∂L/∂cum_last (chunk_grads adds the
        # chunk's own writes), from the float32 dH while it is in registers.
        kept_ref[pl.ds(c, 1)] = jnp.full((1,), w.carry * jnp.sum(d_state * state.astype(F32)))
        pulled = (dy_ref[rows, :].astype(F32) * w.into[:, None]).astype(dtype)
        return w.carry * d_state + mm_tn(pulled, c_ref[rows, :])

    load = lambda c: (states_ref[c], vectors(c))  # the entering state tile, a step ahead too
    d_initial_ref[...] = _chunk_loop(num_chunks, load, chunk, d_final_ref[...], reverse=True)


def state_grads(dy, a, C, doc, states, d_final, st: Static):
    """The gradient of the state leaving every chunk `[B, H, NC, P, N]` (dy's dtype), of the
    initial state `[B, H, P, N]` float32, and `carry_c·⟨dH_c, S_c⟩` per chunk `[B, H, NC]`
    float32 (S_c: the stored state entering chunk c). With `backward_block_n` each program
    carries `[backward_block_p, backward_block_n]` of the state (more programs, each reading
    dy again); `kept` is then summed over the column tiles as over the row tiles."""
    batch, length, heads, P = dy.shape
    N = C.shape[-1]
    L, BP, group = st.blocks.chunk, st.blocks.backward_block_p, st.group
    BN = min(st.blocks.backward_block_n or N, N)  # state columns per program
    NB = N // BN
    num_chunks = length // L
    # a fourth grid axis over the column tiles only when there are several (the index maps'
    # `n` is then 0: the same kernel as without the option)
    grid = (batch, heads, P // BP) + ((NB,) if NB > 1 else ())
    tile = pl.BlockSpec((None, None, BP, BN), lambda b, h, p, n=0: (b, h, p, n))
    boundary = pl.BlockSpec((None, None, num_chunks, BP, BN),
                            lambda b, h, p, n=0: (b, h, 0, p, n))
    in_specs = [pl.BlockSpec((None, length, None, BP), lambda b, h, p, n=0: (b, 0, h, p)),
                pl.BlockSpec((None, None, length), lambda b, h, p, n=0: (b, h, 0)),
                pl.BlockSpec((None, length, None, BN),
                             lambda b, h, p, n=0: (b, 0, h // group, n))]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, length), lambda b, h, p, n=0: (b, 0)))
    kept_tile = (lambda b, h, p, n: (b, h, p * NB + n, 0)) if NB > 1 else (
        lambda b, h, p: (b, h, p, 0))
    d_states, d_initial, kept = pallas_call(
        functools.partial(_state_grads_kernel, st=st, num_chunks=num_chunks),
        grid=grid, in_specs=in_specs + [boundary, tile],
        out_specs=[boundary, tile, pl.BlockSpec((None, None, None, num_chunks), kept_tile)],
        out_shape=[jax.ShapeDtypeStruct((batch, heads, num_chunks, P, N), dy.dtype),
                   jax.ShapeDtypeStruct(d_final.shape, F32),
                   jax.ShapeDtypeStruct((batch, heads, P // BP * NB, num_chunks), F32)],
        compiler_params=triton_params(st.blocks.backward_num_warps, st.blocks.backward_num_stages),
        interpret=st.interpret, name="ssd_state_grads",
    )(dy, a, C, *_doc_args(st, doc), states, d_final)
    return d_states, d_initial, jnp.sum(kept, axis=2)


# --- backward: every chunk in parallel --------------------------------------------------------


def _chunk_grads_kernel(*refs, st: Static):
    summed = st.blocks.grads_summed_scores
    x_ref, dt_ref, a_ref, b_ref, c_ref = refs[:5]
    doc_ref = refs[5] if st.documents else None
    # `extra_ref`: the reverse pass's `kept`, or with `summed` the chunk's C·Bᵀ (XLA's).
    # `vector_refs`: d a, or with `summed` the per-step part of ∂L/∂cum (pairs, entering
    # state) and the leaving-state pull, which `chunk_grads` combines.
    (dy_ref, states_ref, d_states_ref, extra_ref, dx_ref, ddt_ref, *vector_refs, db_ref,
     dc_ref) = refs[5 + st.documents:]
    keys, queries = b_ref[...], c_ref[...]  # [L, N], shared by the group's heads
    dtype = keys.dtype
    doc = None if doc_ref is None else doc_ref[...]
    # C_t·B_s, [L, L]. Made here by a product whose result reaches another product (through
    # the scores), it takes Triton's chained-product warp layout, its L rows repeated on both
    # warp groups of 8 warps, and so does all it multiplies (NOTES.md, session 18).
    raw_scores = extra_ref[...] if summed else mm_nt(queries, keys)
    L, P = raw_scores.shape[0], x_ref.shape[-1]
    BP = st.blocks.grads_block_p
    tiles = [pl.ds(p * BP, BP) for p in range(P // BP)]

    def head(r, grads):
        d_queries, d_keys, d_pairs = grads
        dt = dt_ref[r, :]
        # with `summed`, a_ref holds the chunk's inclusive cumulative log decay
        total = jnp.sum(a_ref[r, pl.ds(L - 1, 1)]) if summed else None
        w = chunk_weights(a_ref[r, :], doc, total=total)
        decay = pair_decay(w.cum, doc)
        loaded = [(x_ref[:, r, cols], dy_ref[:, r, cols]) for cols in tiles]  # once per head
        # D_ts = (dy_t·dt_s x_s) e^{cum_t − cum_s}: the gradient of the decayed scores. dt
        # scales the products' rows or columns, never an operand: x goes to the matmuls as
        # loaded (no float32 or rescaled copies of it in registers).
        d_scores = sum(mm_nt(dy, x) for x, dy in loaded) * (decay * dt[None, :])
        products = d_scores * raw_scores  # ∂L/∂cum through the pairs: rows minus columns
        d_cum = jnp.sum(products, axis=1) - jnp.sum(products, axis=0)
        scores = (raw_scores * decay).astype(dtype)
        if summed:  # summed over the heads, multiplied by B and C once after the loop
            d_pairs += d_scores
        else:
            d_scores = d_scores.astype(dtype)
            d_queries += mm(d_scores, keys)
            d_keys += mm_tn(d_scores, queries)
        through_entry = pull = d_dt = 0.0
        for cols, (x, dy) in zip(tiles, loaded, strict=True):
            state, d_state = states_ref[r, cols, :], d_states_ref[r, cols, :]
            x32 = x.astype(F32)
            # du = Sᵀ-pair part + leaving-state part. Neither is added to the other as a raw
            # matmul result (each has a second use), so Triton does not chain the two
            # products into one accumulator (a chained product takes a warp layout that
            # repeats M = L rows on every warp group).
            via_pairs = mm_tn(scores, dy)
            via_state = w.out[:, None] * mm_nt(keys, d_state)  # du via the leaving state
            state_pull = jnp.sum(x32 * via_state, axis=1)
            pull += dt * state_pull  # out_s u_s·(dH B_s) = B_s·dB_s via that state
            d_dt += jnp.sum(x32 * via_pairs, axis=1) + state_pull
            dx_ref[:, r, cols] = ((via_pairs + via_state) * dt[:, None]).astype(dx_ref.dtype)
            through_entry += w.into[:, None] * mm(dy, state)  # dC via the entering state
            d_keys += (w.out * dt)[:, None] * mm(x, d_state)  # dB via the leaving state
        # C loaded again here (an L1/L2 hit): a float32 copy hoisted out of the head loop
        # would hold 32 registers per thread through it.
        d_cum += jnp.sum(c_ref[...].astype(F32) * through_entry, axis=1)
        d_queries += through_entry
        ddt_ref[r, :] = d_dt
        # The leaving state S' = carry·S + Σ_s out_s u_s B_sᵀ adds ⟨dH, S'⟩ at the last step:
        # its first part came from the reverse pass (`kept`).
        if summed:  # the chunk sums by XLA: each one CTA-wide scan or reduction fewer here
            d_cum_ref, pull_ref = vector_refs
            d_cum_ref[r, :] = d_cum
            pull_ref[r, :] = pull
        else:
            vector_refs[0][r, :] = reverse_cumsum(d_cum - pull) + (extra_ref[r] + jnp.sum(pull))
        return d_queries, d_keys, d_pairs

    zeros = jnp.zeros(keys.shape, F32)
    pairs = jnp.zeros(raw_scores.shape, F32) if summed else None
    d_queries, d_keys, d_pairs = lax.fori_loop(0, st.group, head, (zeros, zeros, pairs))
    if summed:
        d_pairs = d_pairs.astype(dtype)
        d_queries += mm(d_pairs, keys)
        d_keys += mm_tn(d_pairs, queries)
    dc_ref[...] = d_queries
    db_ref[...] = d_keys


def chunk_grads(x, dt, a, B, C, doc, dy, states, d_states, kept, st: Static):
    """Gradients `(dx, d dt, d a, dB, dC)`: dx in x's dtype; d dt (through dt·x only) and
    d a `[B, H, T]` float32; dB, dC `[B, T, G, N]` float32. `kept`: `state_grads`' third
    output. With `grads_summed_scores` XLA makes the kernel's chunk sums: the cumulative log
    decay and C·Bᵀ before it, d a's reverse cumulative sum after it."""
    batch, length, heads, P = x.shape
    groups, N = B.shape[2:]
    L, R = st.blocks.chunk, st.group
    summed = st.blocks.grads_summed_scores
    heads_of = lambda d: pl.BlockSpec((None, L, R, d), lambda b, g, c: (b, c, g, 0))
    per_step = pl.BlockSpec((None, R, L), lambda b, g, c: (b, g, c))
    keys = pl.BlockSpec((None, L, None, N), lambda b, g, c: (b, c, g, 0))
    boundary = pl.BlockSpec((None, R, None, P, N), lambda b, g, c: (b, g, c, 0, 0))
    in_specs = [heads_of(P), per_step, per_step, keys, keys]
    if st.documents:
        in_specs.append(pl.BlockSpec((None, L), lambda b, g, c: (b, c)))
    per_head = jax.ShapeDtypeStruct((batch, heads, length), F32)
    num_vectors = 2 if summed else 1
    if summed:
        by_chunk = lambda v: v.reshape(batch, length // L, L, groups, N)
        extra = jnp.einsum("bctgn,bcsgn->bgcts", by_chunk(C), by_chunk(B),
                           preferred_element_type=F32)  # [B, G, NC, L, L]
        extra_spec = pl.BlockSpec((None, None, None, L, L), lambda b, g, c: (b, g, c, 0, 0))
        a = chunk_cumsum(a, L)
    else:
        extra, extra_spec = kept, pl.BlockSpec((None, R, None), lambda b, g, c: (b, g, c))
    dx, d_dt, *vectors, dB, dC = pallas_call(
        functools.partial(_chunk_grads_kernel, st=st),
        grid=(batch, groups, length // L),
        in_specs=in_specs + [heads_of(P), boundary, boundary, extra_spec],
        out_specs=[heads_of(P), per_step] + [per_step] * num_vectors + [keys, keys],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype), per_head] + [per_head] * num_vectors
                  + [jax.ShapeDtypeStruct(B.shape, F32), jax.ShapeDtypeStruct(C.shape, F32)],
        compiler_params=triton_params(st.blocks.grads_num_warps, st.blocks.grads_num_stages),
        interpret=st.interpret, name="ssd_chunk_grads",
    )(x, dt, a, B, C, *_doc_args(st, doc), dy, states, d_states, extra)
    if not summed:
        return dx, d_dt, vectors[0], dB, dC
    # ∂L/∂a_j = Σ_{t ≥ j} ∂L/∂cum_t within the chunk, where the last step also has ⟨dH, S'⟩:
    # the reverse pass's part (`kept`) and the chunk's own writes (Σ pull).
    per_step_part, pull = (v.reshape(batch, heads, length // L, L) for v in vectors)
    end = kept + jnp.sum(pull, axis=-1)
    d_a = lax.cumsum(per_step_part - pull, axis=3, reverse=True) + end[..., None]
    return dx, d_dt, d_a.reshape(batch, heads, length), dB, dC
