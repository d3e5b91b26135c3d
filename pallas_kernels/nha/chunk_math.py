"""Per-chunk math of NHA shared by the GPU and TPU kernels (values and refs of one chunk).

One head, one chunk of C steps of the slot stream (the inputs that enter the slots, shifted by
the window), local rows 0..C−1. G `[C, M]` is the cumulative log gate from the chunk start,
inclusive (non-increasing down the rows); the state entering the chunk reaches row t with decay
e^{G_t}, a write at row j reaches row t ≥ j with e^{G_t − G_j}. Four forms appear:

  scores   out_t = e^{G_t}·(x_t S) + Σ_{j≤t} (x_t·x'_j) e^{G_t − G_j} ⊙ y_j          `[C, M]`
           (slot logits: x = q, x' = k̄, y = s̄, S = K̃; dP of the slots: x = dO, x' = v̄)
  readout  out_t = (p_t ⊙ e^{G_t}) Sᵀ + Σ_{j≤t} (Σ_m p_tm e^{G_tm − G_jm} y_jm) u_j   `[C, Y]`
           (slot values: p = P, u = v̄, Sᵀ = Ṽᵀ; dq: p = dA, u = k̄, Sᵀ = K̃)
  and their transposes, summed over the query rows t ≥ n for each key row n (the slot-input
  gradients, `slot_input_grads`).

The per-slot decay e^{G_t − G_j} is a `[C, C, M]` tensor; it is never built. Fast path (taken
when every slot decays by less than e^{−60} over the chunk, i.e. almost always): one
factorisation at the chunk start, e^{G_t}·e^{−G_j}, both factors within float32 range (≤ e^{60}),
so each form is two chunk-sized matmuls. Otherwise (strong gates) the exact sub-chunk path: the
pairs are cut by sub-chunks of S rows and factorised at a sub-chunk boundary r as
e^{G_t − G_r}·e^{G_r − G_j}:
for the query-row forms r is the last row of the key sub-chunk, for the key-row forms the first
row of the query sub-chunk. Every factor is then ≤ 1 except inside the diagonal sub-chunk, where
one factor can reach e^{|G_j − G_r|} over at most S − 1 steps: exact unless S − 1 consecutive log
gates of one slot sum below about −87 (float32 overflow; with g = logsigmoid(f)/8 and S = 16
that needs f < −46 on 15 consecutive tokens). Rows outside a sub-chunk's pairs are masked
before `exp`, so nothing overflows there.

Every dot accumulates in float32. The products with the float32 slot states take float32
operands (TF32 on the GPU's tensor cores, exact in interpret mode), except those of the
slot-input gradients dk̄, dv̄; every other product takes the `dtype` its caller passes
(`layout.slot_dtype`). Under the default precision that is bf16 only where the result is itself
a gradient (dq, dk̄, dv̄), and float32 wherever the backward subtracts nearly equal numbers
(dA = P·(dP − D), the log-gate gradient): bf16 operands there cost an order of magnitude in the
gradients' accuracy (NOTES.md).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

F32 = jnp.float32
MASK_VALUE = -1e30
"""Logit of a masked entry: finite, so running maxima never meet inf − inf."""

Rows = Callable[[int, int], jax.Array]
"""`rows(start, size)` loads rows start..start+size−1 of one head's chunk: `[size, X]`."""


def mm(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b with float32 accumulation."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def mm_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ bᵀ with float32 accumulation."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def mm_tn(a: jax.Array, b: jax.Array) -> jax.Array:
    """aᵀ @ b with float32 accumulation."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=F32)


def iota(shape: tuple[int, int], axis: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def rows_of(ref, *index) -> Rows:
    """Row loader for `ref[rows, *index, :]` (index selects e.g. a head of a GQA group)."""
    return lambda start, size: ref[(pl.ds(start, size), *index, slice(None))]


def window_mask(rows: jax.Array, cols: jax.Array, window: int) -> jax.Array:
    """Key position `cols` is in the window of query position `rows` (t − w < j ≤ t)."""
    return (cols <= rows) & (cols > rows - window)


FAST_PATH_LIMIT = 60.0
"""Largest slot log-decay over one chunk for the single-factorisation path (e^{60} ≈ 1e26)."""


def _fast_path(g: Rows, C: int) -> jax.Array:
    """Every slot's cumulative log gate over the chunk (its last row) stays above −60."""
    return jnp.min(g(C - 1, 1)) >= -FAST_PATH_LIMIT


def _causal(C: int) -> jax.Array:
    """`[C, C]`: key row j ≤ query row t."""
    return iota((C, C), 0) >= iota((C, C), 1)


def _key_subchunk_decays(G: jax.Array, g: Rows, jb: int, S: int):
    """Factors at the last row r of key sub-chunk jb: e^{G_t − G_r} for every row t ≥ jb·S
    (else 0) `[C, M]`, and e^{G_r − G_j} ≤ 1 for its rows j `[S, M]`."""
    ref = g(jb * S + S - 1, 1)
    query = jnp.exp(jnp.where(iota((G.shape[0], 1), 0) >= jb * S, G - ref, -jnp.inf))
    return query, jnp.exp(ref - g(jb * S, S))


def _query_subchunk_decays(G: jax.Array, g: Rows, ib: int, S: int):
    """Factors at the first row r of query sub-chunk ib: e^{G_t − G_r} ≤ 1 for its rows t
    `[S, M]`, and e^{G_r − G_n} for every key row n < (ib + 1)·S (else 0) `[C, M]`."""
    ref = g(ib * S, 1)
    key = jnp.exp(jnp.where(iota((G.shape[0], 1), 0) < (ib + 1) * S, ref - G, -jnp.inf))
    return jnp.exp(g(ib * S, S) - ref), key


def slot_scores(pairs, y: Rows, g: Rows, *, S: int, dtype) -> list[jax.Array]:
    """The scores form for several `(x [C, X] value, x' Rows, state [X, M] f32)` that share y
    (s̄) and the gates: one `[C, M]` float32 array per pair."""
    C = pairs[0][0].shape[0]

    def fast():
        G = g(0, C)
        y_inv = (y(0, C).astype(F32) * jnp.exp(-G)).astype(dtype)
        return tuple(
            jnp.exp(G) * (mm(x.astype(F32), state) + mm(jnp.where(
                _causal(C), mm_nt(x.astype(dtype), x_keys(0, C).astype(dtype)), 0.0
            ).astype(dtype), y_inv))
            for x, x_keys, state in pairs)

    return list(lax.cond(_fast_path(g, C), fast,
                         lambda: _slot_scores_subchunks(pairs, y, g, S=S, dtype=dtype)))


def _slot_scores_subchunks(pairs, y: Rows, g: Rows, *, S: int, dtype):
    C = pairs[0][0].shape[0]
    G = g(0, C)
    entry = jnp.exp(G)
    outs = [entry * mm(x.astype(F32), state) for x, _, state in pairs]
    for jb in range(C // S):
        query, key = _key_subchunk_decays(G, g, jb, S)
        y_jb = (y(jb * S, S).astype(F32) * key).astype(dtype)
        mask = iota((C, S), 0) >= iota((C, S), 1) + jb * S
        for n, (x, x_keys, _) in enumerate(pairs):
            a = jnp.where(mask, mm_nt(x.astype(dtype), x_keys(jb * S, S).astype(dtype)), 0.0)
            outs[n] = outs[n] + query * mm(a.astype(dtype), y_jb)
    return tuple(outs)


def slot_readout(p: jax.Array, y: Rows, u: Rows, g: Rows, state_t: jax.Array, *, S: int,
                 dtype) -> jax.Array:
    """The readout form: p `[C, M]` float32 weights of the slots, u the values `[C, Y]`
    entering with s̄ = y, state_t `[Y, M]` float32 (Ṽᵀ or K̃). Returns `[C, Y]` float32."""
    C = p.shape[0]

    def fast():
        G = g(0, C)
        weights = p * jnp.exp(G)
        y_inv = (y(0, C).astype(F32) * jnp.exp(-G)).astype(dtype)
        pairs = jnp.where(_causal(C), mm_nt(weights.astype(dtype), y_inv), 0.0)
        return mm_nt(weights, state_t) + mm(pairs.astype(dtype), u(0, C).astype(dtype))

    return lax.cond(_fast_path(g, C), fast,
                    lambda: _slot_readout_subchunks(p, y, u, g, state_t, S=S, dtype=dtype))


def _slot_readout_subchunks(p, y: Rows, u: Rows, g: Rows, state_t, *, S: int, dtype):
    C = p.shape[0]
    G = g(0, C)
    out = mm_nt(p * jnp.exp(G), state_t)
    for jb in range(C // S):
        query, key = _key_subchunk_decays(G, g, jb, S)
        y_jb = (y(jb * S, S).astype(F32) * key).astype(dtype)
        mask = iota((C, S), 0) >= iota((C, S), 1) + jb * S
        w = jnp.where(mask, mm_nt((p * query).astype(dtype), y_jb), 0.0)
        out = out + mm(w.astype(dtype), u(jb * S, S).astype(dtype))
    return out


def slot_input_grads(heads, k_in: jax.Array, v_in: jax.Array, s_in: jax.Array, g: Rows,
                     k_end: jax.Array, vt_end: jax.Array, *, S: int, scale: float, dtype,
                     ds_dtype):
    """Gradients of one chunk's slot inputs (k̄ `[C, K]`, v̄ `[C, V]`, s̄ `[C, M]`, values).

    heads: per query head of the group `(q, dO, dA, P)` Rows (query rows of this chunk; dA the
    gradient of the scaled slot logits, P the slot probabilities). k_end `[K, M]`, vt_end
    `[V, M]`: gradients of K̃ and Ṽᵀ after the chunk. dtype: operands of the products of dk̄
    and dv̄; ds_dtype: of those of ds̄ (it feeds the log-gate gradient, a difference of nearly
    equal sums). Returns float32 `(dk̄, dv̄, ds̄)`.
    """
    C = k_in.shape[0]
    G = g(0, C)
    exit_decay = jnp.exp(g(C - 1, 1) - G)  # write n as seen at the chunk end, ≤ 1
    written = (s_in.astype(F32) * exit_decay).astype(dtype)
    dk = mm_nt(written, k_end.astype(dtype))
    dv = mm_nt(written, vt_end.astype(dtype))
    ds = exit_decay * (mm(k_in.astype(ds_dtype), k_end.astype(ds_dtype))
                       + mm(v_in.astype(ds_dtype), vt_end.astype(ds_dtype)))
    # (Computing the within-chunk part first measured 1.4 ms slower on the H200: NOTES.md, v5.)
    dtypes = dict(dtype=dtype, ds_dtype=ds_dtype)
    intra = lax.cond(
        _fast_path(g, C),
        lambda: _input_grads_fast(heads, k_in, v_in, s_in, g, scale=scale, **dtypes),
        lambda: _input_grads_subchunks(heads, k_in, v_in, s_in, g, S=S, scale=scale, **dtypes))
    return dk + intra[0], dv + intra[1], ds + intra[2]


def _input_grads_fast(heads, k_in, v_in, s_in, g: Rows, *, scale: float, dtype, ds_dtype):
    C = k_in.shape[0]
    G = g(0, C)
    entry, inverse = jnp.exp(G), jnp.exp(-G)
    s_inv = (s_in.astype(F32) * inverse).astype(dtype)
    mask = iota((C, C), 0) <= iota((C, C), 1)  # key row n ≤ query row t
    k_in, v_in = k_in.astype(ds_dtype), v_in.astype(ds_dtype)
    dk = dv = inner = 0.0
    for q, do, da, p in heads:
        q_all, do_all = q(0, C), do(0, C)
        da_entry, p_entry = da(0, C) * entry, p(0, C) * entry
        dk += scale * mm(jnp.where(mask, mm_nt(s_inv, da_entry.astype(dtype)), 0.0
                                   ).astype(dtype), q_all.astype(dtype))
        dv += mm(jnp.where(mask, mm_nt(s_inv, p_entry.astype(dtype)), 0.0).astype(dtype),
                 do_all.astype(dtype))
        qk = jnp.where(mask, scale * mm_nt(k_in, q_all.astype(ds_dtype)), 0.0)
        ov = jnp.where(mask, mm_nt(v_in, do_all.astype(ds_dtype)), 0.0)
        inner += (mm(qk.astype(ds_dtype), da_entry.astype(ds_dtype))
                  + mm(ov.astype(ds_dtype), p_entry.astype(ds_dtype)))
    return dk, dv, inverse * inner


def _input_grads_subchunks(heads, k_in, v_in, s_in, g: Rows, *, S: int, scale: float, dtype,
                           ds_dtype):
    C = k_in.shape[0]
    G = g(0, C)
    dk = dv = ds = 0.0
    for ib in range(C // S):
        query, key = _query_subchunk_decays(G, g, ib, S)
        mask = iota((C, S), 0) <= iota((C, S), 1) + ib * S  # key row n ≤ query row t
        s_key = (s_in.astype(F32) * key).astype(dtype)
        inner = jnp.zeros_like(G)
        for q, do, da, p in heads:
            q_ib, do_ib = q(ib * S, S), do(ib * S, S)
            da_ib, p_ib = da(ib * S, S) * query, p(ib * S, S) * query
            dk += scale * mm(jnp.where(mask, mm_nt(s_key, da_ib.astype(dtype)), 0.0
                                       ).astype(dtype), q_ib.astype(dtype))
            dv += mm(jnp.where(mask, mm_nt(s_key, p_ib.astype(dtype)), 0.0).astype(dtype),
                     do_ib.astype(dtype))
            qk = jnp.where(mask, scale * mm_nt(k_in.astype(ds_dtype), q_ib.astype(ds_dtype)), 0.0)
            ov = jnp.where(mask, mm_nt(v_in.astype(ds_dtype), do_ib.astype(ds_dtype)), 0.0)
            inner += (mm(qk.astype(ds_dtype), da_ib.astype(ds_dtype))
                      + mm(ov.astype(ds_dtype), p_ib.astype(ds_dtype)))
        ds += key * inner
    return dk, dv, ds
