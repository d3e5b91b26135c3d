"""Forward kernels of the gated delta rule (Pallas, Triton lowering on GPUs).

Layout: q, k `[B, Tp, H, K]`, v `[B, Tp, H, V]` (time padded to a multiple of the chunk C),
g and β `[B, H, Tp]` float32, document starts `[B, Tp]` float32 (1.0 at a start) when the call
has documents, states `[B, H, K, V]` float32. Per-chunk intermediates are in the input dtype:
W `[B, Tp, H, K]`, U₀ and U `[B, Tp, H, V]`, P and T `[B, Tp, H, C]` (row t of its chunk's
C×C matrix), the states entering each chunk `[B, H, NC·K, V]`; the backward's gradients of the
states after each chunk are float32 (`backward.py`).

  chunk_prepare             one program per (batch, head, chunk): P, T, W, U₀
  chunk_states_and_outputs  one program per (batch, head, V tile): the sequential pass over
                            chunks, the state in registers, the outputs of every chunk
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call
from pallas_kernels.delta_rule.chunk_math import (
    F32,
    Rows,
    block_lower_inverse,
    chunk_decays,
    decay_matrix,
    entry_decay,
)
from pallas_kernels.delta_rule.layout import (
    ChunkSpecs,
    SequentialSpecs,
    chunk_loop,
    load_chunk,
    split_refs,
    with_starts,
)
from pallas_kernels.delta_rule.static import Static, compiler_params
from pallas_kernels.matmul import mm, mm_nt, mm_tn


def _sub_chunk_rows(g_ref, starts_ref, size: int, count: int) -> list[Rows]:
    """Γ and document counters of the chunk's sub-chunks of `size` rows (each continues the
    cumulative sums of the ones before it)."""
    rows, log_offset, doc_offset = [], 0.0, 0.0
    for i in range(count):
        span = pl.ds(i * size, size)
        g = g_ref[span]
        docs = None
        if starts_ref is not None:
            starts = starts_ref[span]
            docs = jnp.cumsum(starts) + doc_offset
            doc_offset = doc_offset + jnp.sum(starts)
        rows.append(Rows(i * size, jnp.cumsum(g) + log_offset, docs))
        log_offset = log_offset + jnp.sum(g)
    return rows


def _prepare_kernel(*refs, st: Static, save: bool):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, outs = split_refs(refs, 5, st.documents)
    w_ref, u0_ref, p_ref = outs[:3]
    t_ref = outs[3] if save else None
    C, S = st.blocks.chunk, st.blocks.sub_chunk
    count = C // S
    op = k_ref.dtype
    chunk = chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    p_ref[...] = (st.scale * mm_nt(q_ref[...], k_ref[...]) * chunk.pairs()).astype(op)

    rows = _sub_chunk_rows(g_ref, starts_ref, S, count)
    key = lambda i: k_ref[pl.ds(i * S, S), :]
    betas = [beta_ref[pl.ds(i * S, S)] for i in range(count)]
    # A_tj = β_t (k_t·k_j) e^{Γ_t − Γ_j} (j < t), in S×S blocks.
    a = {(i, j): betas[i][:, None] * mm_nt(key(i), key(j))
         * decay_matrix(rows[i], rows[j], strict=i == j)
         for i in range(count) for j in range(i + 1)}
    t = block_lower_inverse(a, count)
    # Right-hand sides loaded where used (shorter live ranges than holding every block).
    # U₀ = T (β ⊙ V) takes float32 operands (TF32 on the GPU): U = U₀ − W S nearly cancels
    # once the state holds v, and bf16 T, βV there cost dg an order of magnitude (NOTES.md).
    x = lambda j: (key(j) * (betas[j] * entry_decay(rows[j]))[:, None]).astype(op)
    y = lambda j: v_ref[pl.ds(j * S, S), :].astype(F32) * betas[j][:, None]
    for i in range(count):
        span = pl.ds(i * S, S)
        w_ref[span, :] = sum(mm(t[i, j].astype(op), x(j)) for j in range(i + 1)).astype(op)
        u0_ref[span, :] = sum(mm(t[i, j], y(j)) for j in range(i + 1)).astype(op)
        if save:
            for j in range(count):
                block = t[i, j] if j <= i else jnp.zeros((S, S), F32)
                t_ref[span, pl.ds(j * S, S)] = block.astype(op)


def chunk_prepare(q, k, v, g, beta, starts, st: Static, *, save: bool):
    """Per chunk, in parallel: P = scale·(Q Kᵀ) ⊙ D, T = (I + A)⁻¹, W = T (β e^Γ ⊙ K),
    U₀ = T (β ⊙ V) (NOTES.md). Returns (W, U₀, P), and T when `save` (the backward's)."""
    batch, length, heads, key_dim = q.shape
    value_dim, C = v.shape[-1], st.blocks.chunk
    specs = ChunkSpecs(C)
    in_specs, args = with_starts(
        [specs.rows(key_dim), specs.rows(key_dim), specs.rows(value_dim), specs.steps(),
         specs.steps()], [q, k, v, g, beta], specs.starts(), starts, st.documents)
    shape = lambda d: jax.ShapeDtypeStruct((batch, length, heads, d), k.dtype)
    out_specs = [specs.rows(key_dim), specs.rows(value_dim), specs.rows(C)]
    out_specs += [specs.rows(C)] * save
    out_shape = [shape(key_dim), shape(value_dim), shape(C)] + [shape(C)] * save
    blocks = st.blocks
    return pallas_call(
        functools.partial(_prepare_kernel, st=st, save=save),
        grid=(batch, heads, length // C), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=compiler_params(blocks.prepare_num_warps, blocks.prepare_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_prepare",
    )(*args)


def _states_kernel(*refs, st: Static, save: bool, num_chunks: int):
    (q_ref, k_ref, w_ref, u0_ref, p_ref, g_ref), starts_ref, rest = split_refs(
        refs, 6, st.documents)
    init_ref, o_ref, final_ref, *saved = rest
    C, key_dim = st.blocks.chunk, k_ref.shape[-1]
    op = k_ref.dtype
    sources = dict(q=q_ref, k=k_ref, w=w_ref, u0=u0_ref, p=p_ref, g=g_ref)

    def step(c, state, x):
        # What does not depend on the state first; the chain to the next chunk is W S → U →
        # K̃ᵀ U, the outputs hang off it.
        chunk = chunk_decays(x["g"], x["starts"])
        queries = (x["q"] * (st.scale * chunk.entry)[:, None]).astype(op)
        keys = (x["k"] * chunk.to_end[:, None]).astype(op)
        state_op = state.astype(op)
        u_op = (x["u0"].astype(F32) - mm(x["w"], state_op)).astype(op)
        span = pl.ds(c * C, C)
        if save:
            states_ref, u_ref = saved
            states_ref[pl.ds(c * key_dim, key_dim), :] = state_op
            u_ref[span, :] = u_op
        o_ref[span, :] = (mm(queries, state_op) + mm(x["p"], u_op)).astype(o_ref.dtype)
        return chunk.decay * state + mm_tn(keys, u_op)

    final_ref[...] = chunk_loop(num_chunks, lambda c: load_chunk(sources, starts_ref, c, C),
                                step, init_ref[...], reverse=False,
                                prefetch=st.blocks.prefetch)


def chunk_states_and_outputs(q, k, w, u0, p, g, starts, initial_state, st: Static, *,
                             save: bool):
    """The sequential pass (NOTES.md): per chunk U = U₀ − W S, o = Q̃ S + P U,
    S ← e^{Γ_C} S + K̃ᵀ U. Returns (o in q's dtype, final state float32), and when `save` the
    states entering each chunk and U (input dtype)."""
    batch, length, heads, key_dim = q.shape
    value_dim, C, tile = u0.shape[-1], st.blocks.chunk, st.blocks.value_block
    num_chunks = length // C
    specs = SequentialSpecs(length, tile)
    in_specs, args = with_starts(
        [specs.whole(key_dim), specs.whole(key_dim), specs.whole(key_dim), specs.tiled(),
         specs.whole(C), specs.steps()], [q, k, w, u0, p, g], specs.starts(), starts,
        st.documents)
    out_specs = [specs.tiled(), specs.state(key_dim)]
    out_shape = [jax.ShapeDtypeStruct(u0.shape, q.dtype), jax.ShapeDtypeStruct(
        initial_state.shape, F32)]
    if save:
        out_specs += [specs.state(num_chunks * key_dim), specs.tiled()]
        out_shape += [jax.ShapeDtypeStruct((batch, heads, num_chunks * key_dim, value_dim),
                                           k.dtype), jax.ShapeDtypeStruct(u0.shape, k.dtype)]
    blocks = st.blocks
    return pallas_call(
        functools.partial(_states_kernel, st=st, save=save, num_chunks=num_chunks),
        grid=(batch, heads, value_dim // tile), in_specs=in_specs + [specs.state(key_dim)],
        out_specs=out_specs, out_shape=out_shape,
        compiler_params=compiler_params(blocks.state_num_warps, blocks.state_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_states_and_outputs",
    )(*args, initial_state)
