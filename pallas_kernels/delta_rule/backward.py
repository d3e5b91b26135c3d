"""Backward kernels of the gated delta rule (layout as in `forward.py`; dO `[B, Tp, H, V]`).

  chunk_state_gradients  one program per (batch, head, V tile): the reverse-time pass over
                         chunks, dS in registers: dU of every chunk, the gradient of the state
                         after every chunk, the initial state's gradient
  chunk_gradients        one program per (batch, head, chunk): dq, dk, dv, dβ, dg

Per chunk (NOTES.md), with S₀ the state entering it, dS₁ the gradient of the state after it,
R = β ⊙ (V − e^Γ ⊙ K S₀) = (I + A) U and X = β e^Γ ⊙ K:

    dU  = Pᵀ dO + K̃ dS₁                  (sequential, with dS₀ = e^{Γ_C} dS₁ + Q̃ᵀ dO − Wᵀ dU)
    dR  = Tᵀ dU,   dv = β ⊙ dR,   dA = −dR Uᵀ (strictly lower),   dX = −dR S₀ᵀ
    dQ̃ = dO S₀ᵀ,  dK̃ = U dS₁ᵀ,   dP = dO Uᵀ

and the gradients of the decays (row/column sums of dA ⊙ A, dP ⊙ P, ...) into dΓ, whose reverse
cumulative sum within the chunk is dg (Γ restarts at every chunk).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call
from pallas_kernels.delta_rule.chunk_math import (
    F32,
    chunk_decays,
    iota,
    reverse_cumsum,
    total,
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


def _state_gradients_kernel(*refs, st: Static, num_chunks: int):
    (q_ref, k_ref, w_ref, p_ref, do_ref, g_ref), starts_ref, rest = split_refs(
        refs, 6, st.documents)
    d_final_ref, du_ref, d_states_ref, d_initial_ref = rest
    C, key_dim = st.blocks.chunk, k_ref.shape[-1]
    op = k_ref.dtype
    sources = dict(q=q_ref, k=k_ref, w=w_ref, p=p_ref, do=do_ref, g=g_ref)

    def step(c, d_state, x):
        # The chain to the previous chunk is K̃ dS → dU → Wᵀ dU; the rest only needs loads.
        chunk = chunk_decays(x["g"], x["starts"])
        keys = (x["k"] * chunk.to_end[:, None]).astype(op)
        queries = (x["q"] * (st.scale * chunk.entry)[:, None]).astype(op)
        du_local = mm_tn(x["p"], x["do"])  # Pᵀ dO
        carried = chunk.decay * d_state + mm_tn(queries, x["do"])
        du_op = (du_local + mm(keys, d_state.astype(op))).astype(op)
        du_ref[pl.ds(c * C, C), :] = du_op
        d_states_ref[pl.ds(c * key_dim, key_dim), :] = d_state
        return carried - mm_tn(x["w"], du_op)

    d_initial_ref[...] = chunk_loop(num_chunks, lambda c: load_chunk(sources, starts_ref, c, C),
                                    step, d_final_ref[...], reverse=True,
                                    prefetch=st.blocks.prefetch)


def chunk_state_gradients(q, k, w, p, g, starts, d_out, d_final, st: Static):
    """The reverse-time pass. Returns dU `[B, Tp, H, V]` (input dtype), the gradients of the
    state after every chunk `[B, H, NC·K, V]` and of the initial state (float32: in bf16 they
    cost dg an order of magnitude, NOTES.md)."""
    batch, length, heads, key_dim = q.shape
    value_dim, C, tile = d_out.shape[-1], st.blocks.chunk, st.blocks.value_block
    num_chunks = length // C
    specs = SequentialSpecs(length, tile)
    in_specs, args = with_starts(
        [specs.whole(key_dim), specs.whole(key_dim), specs.whole(key_dim), specs.whole(C),
         specs.tiled(), specs.steps()], [q, k, w, p, d_out, g], specs.starts(), starts,
        st.documents)
    blocks = st.blocks
    return pallas_call(
        functools.partial(_state_gradients_kernel, st=st, num_chunks=num_chunks),
        grid=(batch, heads, value_dim // tile), in_specs=in_specs + [specs.state(key_dim)],
        out_specs=[specs.tiled(), specs.state(num_chunks * key_dim), specs.state(key_dim)],
        out_shape=[jax.ShapeDtypeStruct(d_out.shape, k.dtype),
                   jax.ShapeDtypeStruct((batch, heads, num_chunks * key_dim, value_dim), F32),
                   jax.ShapeDtypeStruct(d_final.shape, F32)],
        compiler_params=compiler_params(blocks.state_num_warps, blocks.state_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_state_gradients",
    )(*args, d_final)


def _gradients_kernel(*refs, st: Static):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, rest = split_refs(refs, 5, st.documents)
    (t_ref, s0_ref, ds1_ref, u_ref, du_ref, do_ref,
     dq_ref, dk_ref, dv_ref, dbeta_ref, dg_ref) = rest
    C = st.blocks.chunk
    key_dim, value_dim = k_ref.shape[-1], v_ref.shape[-1]
    key_tile, value_tile = st.blocks.gradient_key_block, st.blocks.gradient_value_block
    key_spans = [pl.ds(i * key_tile, key_tile) for i in range(key_dim // key_tile)]
    value_spans = [pl.ds(j * value_tile, value_tile) for j in range(value_dim // value_tile)]
    op = k_ref.dtype
    chunk = chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    beta = beta_ref[...]
    pairs = chunk.pairs()
    strict = jnp.where(iota((C, C), 0) > iota((C, C), 1), pairs, 0.0)
    t = t_ref[...]
    tiles = lambda j: (du_ref[:, value_spans[j]], u_ref[:, value_spans[j]],
                       do_ref[:, value_spans[j]])

    # Intra-chunk products, contracting over V: dA = −dR Uᵀ and dP = dO Uᵀ; dv from dR.
    d_a = d_p = jnp.zeros((C, C), F32)
    d_beta = jnp.zeros((C,), F32)
    for j, span in enumerate(value_spans):
        du, u, do = tiles(j)
        d_r = mm_tn(t, du)
        dv_ref[:, span] = (beta[:, None] * d_r).astype(dv_ref.dtype)
        d_beta += jnp.sum(d_r * v_ref[:, span].astype(F32), axis=1)
        d_a -= mm_nt(d_r.astype(op), u)
        d_p += mm_nt(do, u)
    kk = mm_nt(k_ref[...], k_ref[...])
    qk = mm_nt(q_ref[...], k_ref[...])
    d_kk = d_a * beta[:, None] * strict  # A = β (K Kᵀ) ⊙ D, strictly lower
    d_qk = st.scale * d_p * pairs        # P = scale (Q Kᵀ) ⊙ D
    d_beta += jnp.sum(d_a * kk * strict, axis=1)
    from_a, from_p = d_kk * kk, d_qk * qk  # dA ⊙ A and dP ⊙ P: their decays' share of dΓ
    d_log = (jnp.sum(from_a, axis=1) - jnp.sum(from_a, axis=0)
             + jnp.sum(from_p, axis=1) - jnp.sum(from_p, axis=0))
    d_kk_sym = (d_kk + d_kk.T).astype(op)
    d_qk_op = d_qk.astype(op)

    # Products with the chunk's states, contracting over V, one K tile at a time.
    to_last = jnp.zeros((), F32)  # dΓ_last from K̃ and from the entering state's decay
    for span_k in key_spans:
        q, k = q_ref[:, span_k], k_ref[:, span_k]
        d_x = d_q = d_k = jnp.zeros((C, key_tile), F32)
        for j, span in enumerate(value_spans):
            du, u, do = tiles(j)
            s0, ds1 = s0_ref[span_k, span], ds1_ref[span_k, span]
            d_r = mm_tn(t, du).astype(op)
            d_x -= mm_nt(d_r, s0)
            d_q += mm_nt(do, s0)
            d_k += mm_nt(u.astype(F32), ds1)  # float32 dS₁ (TF32 on the GPU), see above
            to_last += chunk.decay * total(ds1 * s0.astype(F32))
        qf, kf = q.astype(F32), k.astype(F32)
        dq_ref[:, span_k] = (st.scale * chunk.entry[:, None] * d_q
                             + mm(d_qk_op, k)).astype(dq_ref.dtype)
        dk_ref[:, span_k] = (chunk.to_end[:, None] * d_k + (beta * chunk.entry)[:, None] * d_x
                             + mm_tn(d_qk_op, q) + mm(d_kk_sym, k)).astype(dk_ref.dtype)
        x_k = jnp.sum(d_x * kf, axis=1)
        through_end = chunk.to_end * jnp.sum(d_k * kf, axis=1)
        d_beta += chunk.entry * x_k
        d_log += (chunk.entry * (st.scale * jnp.sum(d_q * qf, axis=1) + beta * x_k)
                  - through_end)
        to_last += jnp.sum(through_end)
    d_log += jnp.where(iota((C,), 0) == C - 1, to_last, 0.0)
    dbeta_ref[...] = d_beta
    dg_ref[...] = reverse_cumsum(d_log)


def chunk_gradients(q, k, v, g, beta, starts, t, states, d_states, u, du, d_out, st: Static):
    """dq, dk, dv (input dtype) and dβ, dg `[B, H, Tp]` (float32) of every chunk, in parallel."""
    batch, length, heads, key_dim = q.shape
    value_dim, C = v.shape[-1], st.blocks.chunk
    specs = ChunkSpecs(C)
    rows, state = specs.rows, specs.state(key_dim, value_dim)
    in_specs, args = with_starts(
        [rows(key_dim), rows(key_dim), rows(value_dim), specs.steps(), specs.steps()],
        [q, k, v, g, beta], specs.starts(), starts, st.documents)
    in_specs += [rows(C), state, state, rows(value_dim), rows(value_dim), rows(value_dim)]
    blocks = st.blocks
    return pallas_call(
        functools.partial(_gradients_kernel, st=st),
        grid=(batch, heads, length // C), in_specs=in_specs,
        out_specs=[rows(key_dim), rows(key_dim), rows(value_dim), specs.steps(), specs.steps()],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(g.shape, F32),
                   jax.ShapeDtypeStruct(g.shape, F32)],
        compiler_params=compiler_params(blocks.gradient_num_warps, blocks.gradient_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_gradients",
    )(*args, t, states, d_states, u, du, d_out)
