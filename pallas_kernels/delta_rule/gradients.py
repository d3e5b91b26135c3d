"""The per-chunk gradient kernels of the gated delta rule (layout as in `forward.py`), after
`backward.chunk_state_gradients` has made dU and the gradients of the states after each chunk.

Per chunk (NOTES.md), with S₀ the state entering it, dS₁ the gradient of the state after it,
R = β ⊙ (V − e^Γ ⊙ K S₀) = (I + A) U and X = β e^Γ ⊙ K:

    dR  = Tᵀ dU,   dv = β ⊙ dR,   dA = −dR Uᵀ (strictly lower),   dX = −dR S₀ᵀ
    dQ̃ = dO S₀ᵀ,  dK̃ = U dS₁ᵀ,   dP = dO Uᵀ

and the gradients of the decays (row/column sums of dA ⊙ A, dP ⊙ P, ...) into dΓ, whose reverse
cumulative sum within the chunk is dg (Γ restarts at every chunk). Two forms
(`BlockSizes.split_gradients`):

  fused  `chunk_gradients`, one program per (batch, head, chunk): everything, the K tiles one
         after another
  split  `chunk_pair_gradients`, one program per (batch, head, chunk): dv and the [C, C]
         gradients of the pair terms, dQK = ∂/∂(Q Kᵀ) and dKK = ∂/∂(K Kᵀ) + its transpose
         (stored in the input dtype, as the fused form rounds them for its products); then
         `chunk_key_gradients`, one program per (batch, head, chunk, K tile): dq and dk of
         that tile. Two small live sets instead of one large one; dβ and dΓ come out as
         partial sums that XLA adds up (dg's cumulative sum too: a few MB).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.delta_rule.chunk_math import F32, chunk_decays, iota, reverse_cumsum, total
from pallas_kernels.delta_rule.layout import ChunkSpecs, KeyTileSpecs, split_refs, with_starts
from pallas_kernels.delta_rule.static import Static
from pallas_kernels.matmul import mm, mm_nt, mm_tn


def _value_spans(value_dim: int, st: Static) -> list:
    tile = st.blocks.gradient_value_block
    return [pl.ds(j * tile, tile) for j in range(value_dim // tile)]


def _over_value_tiles(value_dim: int, st: Static, body, init, pipelined: bool):
    """`carry = body(span, carry)` over the V tiles: unrolled, or when `pipelined` a loop,
    whose loads Triton's pipeliner issues `gradient_num_stages` deep with `cp.async` instead
    of through registers."""
    if not pipelined:
        for span in _value_spans(value_dim, st):
            init = body(span, init)
        return init
    tile = st.blocks.gradient_value_block
    span = lambda j: pl.ds(pl.multiple_of(j * tile, tile), tile)
    return jax.lax.fori_loop(0, value_dim // tile, lambda j, carry: body(span(j), carry), init)


def _pair_part(st: Static, chunk, beta, q_ref, k_ref, v_ref, t_ref, u_ref, du_ref, do_ref,
               dv_ref):
    """dv (stored), and (dQK, dKK) in the input dtype, dβ and dΓ `[C]` of the pair terms."""
    C, op = t_ref.shape[0], k_ref.dtype
    pairs = chunk.pairs()
    lower = iota((C, C), 0) > iota((C, C), 1)  # A's pairs (strictly lower)
    t = t_ref[...]
    # Intra-chunk products, contracting over V: dA = −dR Uᵀ and dP = dO Uᵀ; dv from dR.
    def over_value_tile(span, carry):
        d_a, d_p, d_beta = carry
        u = u_ref[:, span]
        d_r = mm_tn(t, du_ref[:, span])
        dv_ref[:, span] = (beta[:, None] * d_r).astype(dv_ref.dtype)
        d_beta += jnp.sum(d_r * v_ref[:, span].astype(F32), axis=1)
        d_a -= mm_nt(d_r.astype(op), u)
        d_p += mm_nt(do_ref[:, span], u)
        return d_a, d_p, d_beta

    # Unrolled (every tile through registers: 468 B of spills at K 256, 4 warps), or with
    # `pipelined_pair_gradients` a loop whose u, dU, dO come by `cp.async` (no spills,
    # NOTES.md Round 21).
    d_a, d_p, d_beta = _over_value_tiles(
        v_ref.shape[-1], st, over_value_tile,
        (jnp.zeros((C, C), F32), jnp.zeros((C, C), F32), jnp.zeros((C,), F32)),
        st.blocks.pipelined_pair_gradients)
    kk = mm_nt(k_ref[...], k_ref[...])
    qk = mm_nt(q_ref[...], k_ref[...])
    d_a_kk = jnp.where(lower, d_a * kk * pairs, 0.0)  # A = β (K Kᵀ) ⊙ D, strictly lower
    d_beta += jnp.sum(d_a_kk, axis=1)
    d_kk = beta[:, None] * jnp.where(lower, d_a * pairs, 0.0)
    # K Kᵀ has k on both sides: dk gets (d_kk + d_kkᵀ) K. One product of the sum transposed in
    # registers spills less than a second (chained) product with the transposed operand.
    d_kk = (d_kk + d_kk.T).astype(op)
    d_qk = st.scale * d_p * pairs  # P = scale (Q Kᵀ) ⊙ D
    # dA ⊙ A + dP ⊙ P: the decays' share of dΓ (row t gains it, column j loses it).
    from_pairs = beta[:, None] * d_a_kk + d_qk * qk
    d_log = jnp.sum(from_pairs, axis=1) - jnp.sum(from_pairs, axis=0)
    return d_qk.astype(op), d_kk, d_beta, d_log


def _key_part(st: Static, chunk, beta, d_qk, d_kk, keys, q_ref, k_ref, s0_ref, ds1_ref, t_ref,
              u_ref, du_ref, do_ref, dq_ref, dk_ref):
    """dq and dk of the K rows `keys` (stored); their dβ and dΓ `[C]` (dΓ_last included).

    One float32 accumulator at a time (the products over V tiles of dQ̃, then dX, then dK̃),
    each used up (its row sum, its share of dk) before the next: a small live set."""
    op = k_ref.dtype
    over_tiles = functools.partial(_over_value_tiles, u_ref.shape[-1], st,
                                   pipelined=st.blocks.pipelined_key_gradients)
    d_q = over_tiles(lambda span, acc: acc + mm_nt(do_ref[:, span], s0_ref[keys, span]),
                     jnp.zeros((do_ref.shape[0], keys.size), F32))
    q_q = jnp.sum(d_q * q_ref[:, keys].astype(F32), axis=1)
    dq_ref[:, keys] = (st.scale * chunk.entry[:, None] * d_q
                       + mm(d_qk, k_ref[:, keys])).astype(dq_ref.dtype)
    t = t_ref[...]
    # Summed, then negated: Triton folds a sum into the next product's accumulator, not a
    # difference (a float32 tile of its own: 476 B of spills unrolled, NOTES.md Round 17).
    d_x = -over_tiles(lambda span, acc: acc + mm_nt(mm_tn(t, du_ref[:, span]).astype(op),
                                                    s0_ref[keys, span]), jnp.zeros_like(d_q))
    # The row sums from k loaded again each time: a float32 copy kept across the products
    # would stay live (spills, NOTES.md).
    x_k = jnp.sum(d_x * k_ref[:, keys].astype(F32), axis=1)
    d_key = (beta * chunk.entry)[:, None] * d_x

    def through_state(span, carry):
        # dS₁ is float32 (rounded to bf16 it costs dg, NOTES.md): split in two operands,
        # ≈ float32 accuracy, u as loaded.
        d_k, to_last = carry  # to_last: dΓ_last from K̃ and from the entering state's decay
        u, s0, ds1 = u_ref[:, span], s0_ref[keys, span], ds1_ref[keys, span]
        ds1_hi = ds1.astype(op)
        d_k += mm_nt(u, ds1_hi) + mm_nt(u, (ds1 - ds1_hi.astype(F32)).astype(op))
        return d_k, to_last + chunk.decay * total(ds1 * s0.astype(F32))

    d_k, to_last = over_tiles(through_state, (jnp.zeros_like(d_x), jnp.zeros((), F32)))
    through_end = chunk.to_end * jnp.sum(d_k * k_ref[:, keys].astype(F32), axis=1)
    d_key += chunk.to_end[:, None] * d_k
    dk_ref[:, keys] = (d_key + mm_tn(d_qk, q_ref[:, keys])
                       + mm(d_kk, k_ref[:, keys])).astype(dk_ref.dtype)
    d_log = chunk.entry * (st.scale * q_q + beta * x_k) - through_end
    last = iota(d_log.shape, 0) == d_log.shape[0] - 1
    return chunk.entry * x_k, d_log + jnp.where(last, to_last + jnp.sum(through_end), 0.0)


def _gradients_kernel(*refs, st: Static):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, rest = split_refs(refs, 5, st.documents)
    (t_ref, s0_ref, ds1_ref, u_ref, du_ref, do_ref,
     dq_ref, dk_ref, dv_ref, dbeta_ref, dg_ref) = rest
    chunk = chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    beta = beta_ref[...]
    d_qk, d_kk, d_beta, d_log = _pair_part(st, chunk, beta, q_ref, k_ref, v_ref, t_ref, u_ref,
                                           du_ref, do_ref, dv_ref)
    key_tile = st.blocks.gradient_key_block
    for i in range(k_ref.shape[-1] // key_tile):
        beta_part, log_part = _key_part(st, chunk, beta, d_qk, d_kk, pl.ds(i * key_tile, key_tile),
                                        q_ref, k_ref, s0_ref, ds1_ref, t_ref, u_ref, du_ref,
                                        do_ref, dq_ref, dk_ref)
        d_beta += beta_part
        d_log += log_part
    dbeta_ref[...] = d_beta
    dg_ref[...] = reverse_cumsum(d_log)


def _pair_gradients_kernel(*refs, st: Static):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, rest = split_refs(refs, 5, st.documents)
    t_ref, u_ref, du_ref, do_ref, dv_ref, dqk_ref, dkk_ref, dbeta_ref, dlog_ref = rest
    chunk = chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    d_qk, d_kk, dbeta_ref[...], dlog_ref[...] = _pair_part(
        st, chunk, beta_ref[...], q_ref, k_ref, v_ref, t_ref, u_ref, du_ref, do_ref, dv_ref)
    dqk_ref[...], dkk_ref[...] = d_qk, d_kk


def _key_gradients_kernel(*refs, st: Static):
    (q_ref, k_ref, g_ref, beta_ref), starts_ref, rest = split_refs(refs, 4, st.documents)
    (t_ref, s0_ref, ds1_ref, u_ref, du_ref, do_ref, dqk_ref, dkk_ref,
     dq_ref, dk_ref, dbeta_ref, dlog_ref) = rest
    chunk = chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    dbeta_ref[...], dlog_ref[...] = _key_part(
        st, chunk, beta_ref[...], dqk_ref[...], dkk_ref[...], pl.ds(0, k_ref.shape[-1]), q_ref,
        k_ref, s0_ref, ds1_ref, t_ref, u_ref, du_ref, do_ref, dq_ref, dk_ref)


def per_value_head(x, heads: int, axis: int = 2, dtype=None) -> jax.ShapeDtypeStruct:
    """The gradient of key-side x (q, k `[B, Tp, H / group, K]`; g, β `[B, H / group, Tp]`,
    heads on `axis`) for every one of the `heads` value heads: the caller sums the
    `key_group` value heads of a key head."""
    shape = x.shape[:axis] + (heads,) + x.shape[axis + 1:]
    return jax.ShapeDtypeStruct(shape, dtype or x.dtype)


def chunk_gradients(q, k, v, g, beta, starts, t, states, d_states, u, du, d_out, st: Static):
    """dq, dk, dβ and dg of every value head (`per_value_head`; dβ, dg `[B, H, Tp]` float32)
    and dv (input dtype) of every chunk, in parallel: one kernel, or two with
    `split_gradients`."""
    if st.blocks.split_gradients:
        return _split_gradients(q, k, v, g, beta, starts, t, states, d_states, u, du, d_out, st)
    batch, length, heads, value_dim = v.shape
    key_dim, C = q.shape[-1], st.blocks.chunk
    specs = ChunkSpecs(C, st.key_group)
    rows, state = specs.rows, specs.state(key_dim, value_dim)
    in_specs, args = with_starts(
        [specs.shared_rows(key_dim), specs.shared_rows(key_dim), rows(value_dim),
         specs.shared_steps(), specs.shared_steps()],
        [q, k, v, g, beta], specs.starts(), starts, st.documents)
    in_specs += [specs.shared_rows(C), state, state, rows(value_dim), rows(value_dim),
                 rows(value_dim)]
    blocks = st.blocks
    return pallas_call(
        functools.partial(_gradients_kernel, st=st),
        grid=(batch, heads, length // C), in_specs=in_specs,
        out_specs=[rows(key_dim), rows(key_dim), rows(value_dim), specs.steps(), specs.steps()],
        out_shape=[per_value_head(q, heads), per_value_head(k, heads),
                   jax.ShapeDtypeStruct(v.shape, v.dtype), per_value_head(g, heads, 1, F32),
                   per_value_head(g, heads, 1, F32)],
        compiler_params=triton_params(blocks.gradient_num_warps, blocks.gradient_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_gradients",
    )(*args, t, states, d_states, u, du, d_out)


def _split_gradients(q, k, v, g, beta, starts, t, states, d_states, u, du, d_out, st: Static):
    batch, length, heads, value_dim = v.shape
    key_dim, C = q.shape[-1], st.blocks.chunk
    params = triton_params(st.blocks.gradient_num_warps, st.blocks.gradient_num_stages)
    dv, d_qk, d_kk, beta_pairs, log_pairs = chunk_pair_gradients(q, k, v, g, beta, starts, t, u,
                                                                 du, d_out, st, params)
    key_tile = st.blocks.gradient_key_block
    specs = KeyTileSpecs(C, key_dim // key_tile, st.key_group)
    rows = specs.rows
    in_specs, args = with_starts(
        [specs.shared_key_rows(key_tile), specs.shared_key_rows(key_tile), specs.shared_steps(),
         specs.shared_steps()],
        [q, k, g, beta], specs.starts(), starts, st.documents)
    state = specs.state(key_tile, value_dim)
    in_specs += [specs.shared_rows(C), state, state, rows(value_dim), rows(value_dim),
                 rows(value_dim), rows(C), rows(C)]
    partial_shape = jax.ShapeDtypeStruct((batch, heads, specs.tiles, length), F32)
    dq, dk, beta_keys, log_keys = pallas_call(
        functools.partial(_key_gradients_kernel, st=st),
        grid=(batch, heads, length // C * specs.tiles), in_specs=in_specs,
        out_specs=[specs.key_rows(key_tile), specs.key_rows(key_tile), specs.partial(),
                   specs.partial()],
        out_shape=[per_value_head(q, heads), per_value_head(k, heads), partial_shape,
                   partial_shape],
        compiler_params=params, interpret=st.interpret,
        name="gated_delta_rule_chunk_key_gradients",
    )(*args, t, states, d_states, u, du, d_out, d_qk, d_kk)
    d_log = (log_pairs + jnp.sum(log_keys, axis=2)).reshape(batch, heads, -1, C)
    dg = (jnp.sum(d_log, axis=-1, keepdims=True) - jnp.cumsum(d_log, axis=-1) + d_log)
    return dq, dk, dv, beta_pairs + jnp.sum(beta_keys, axis=2), dg.reshape(batch, heads, -1)


def chunk_pair_gradients(q, k, v, g, beta, starts, t, u, du, d_out, st: Static, params):
    """dQK, dKK `[B, Tp, H, C]` and dv (input dtype); the pair terms' dβ and dΓ `[B, H, Tp]`."""
    batch, length, heads, value_dim = v.shape
    key_dim, C = q.shape[-1], st.blocks.chunk
    specs = ChunkSpecs(C, st.key_group)
    rows = specs.rows
    in_specs, args = with_starts(
        [specs.shared_rows(key_dim), specs.shared_rows(key_dim), rows(value_dim),
         specs.shared_steps(), specs.shared_steps()],
        [q, k, v, g, beta], specs.starts(), starts, st.documents)
    in_specs += [specs.shared_rows(C), rows(value_dim), rows(value_dim), rows(value_dim)]
    pair_shape = jax.ShapeDtypeStruct((batch, length, heads, C), q.dtype)
    return pallas_call(
        functools.partial(_pair_gradients_kernel, st=st),
        grid=(batch, heads, length // C), in_specs=in_specs,
        out_specs=[rows(value_dim), rows(C), rows(C), specs.steps(), specs.steps()],
        out_shape=[jax.ShapeDtypeStruct(v.shape, v.dtype), pair_shape, pair_shape,
                   per_value_head(g, heads, 1, F32), per_value_head(g, heads, 1, F32)],
        compiler_params=params, interpret=st.interpret,
        name="gated_delta_rule_chunk_pair_gradients",
    )(*args, t, u, du, d_out)
