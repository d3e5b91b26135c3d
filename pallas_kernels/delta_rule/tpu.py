"""Gated delta rule kernels for TPUs: Pallas with the Mosaic TPU lowering. Tested in TPU
interpret mode on the CPU and lowered to Mosaic at real shapes; never run on a TPU.

The GPU kernels' contract and chunk equations (NOTES.md, "Design"; the gradient formulas of
`gradients.py`), restructured for a TPU, whose grid runs one step after another on a core:
a chunk's state-independent work (A, T, W, U₀, P) is done in the same grid step as the state
update, so nothing per chunk goes through HBM but the forward's entering states (the
backward's residual). Two kernels, grid (B, H, NC) with the chunks a sequential ("arbitrary")
last axis and the carried `[K, V]` float32 state in VMEM scratch:

  forward   chunks first to last: per chunk P, T = (I + A)⁻¹, W, U₀, then U = U₀ − W S,
            o = Q̃ S + P U, S ← e^{Γ_C} S + K̃ᵀ U; with `save`, the state entering each chunk
  backward  chunks last to first, dS in scratch: the same chunk terms again (from q, k, v, g,
            β and the stored entering state), dU = Pᵀ dO + K̃ dS, dS ← e^{Γ_C} dS + Q̃ᵀ dO −
            Wᵀ dU, and every gradient of the chunk (dq, dk, dv, dβ, dg)

Layout (a block's last two axes whole or (8, 128)-aligned): q, k, v, o and their gradients
head-major `[B, H, Tp, D]` (XLA transposes outside the kernels; blocks `(C, D)`, D whole, so
D = 64 works as 128 and 256), the per-step vectors g, β, document starts `[…, NC, 1, C]` with
`(1, C)` blocks, states `[B, H, K, V]` and the entering states `[B, H, NC, K, V]` (input dtype).
Inside a kernel every array is 2-D: per-step values are columns `[C, 1]` (row scales of
`[C, D]` tiles, sums along lanes) or rows `[1, C]` (column scales), scalars `[1, 1]`; a row
becomes a column and back through a masked `[C, C]` sum, cumulative sums are masked `[C, C]`
sums (exact float32 adds, no cumsum or 1-D relayout for Mosaic to lower). The triangular
inverse is matmuls only: the 2 × 2 diagonal blocks in closed form, then the GPU's pairwise
merges (`chunk_math.merge_diagonal_blocks`) 2 → 4 → … → C, no per-row loop.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.call import pallas_call
from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.chunk_math import (
    F32,
    masked_exp,
    merge_diagonal_blocks,
    split_rows,
)
from pallas_kernels.delta_rule.layout import split_refs
from pallas_kernels.delta_rule.static import Static
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.residuals import saved

CHUNKS = (64, 128)  # C on a TPU: the (8, 128) rule, the MXU's tiles; 64 by default
DEFAULT_BLOCKS = BlockSizes(chunk=64)  # the TPU kernels read only `chunk`


# --- per-step vectors as 2-D columns and rows -------------------------------------------------


def _iota(n: int, axis: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, (n, n), axis)


def _column(row: jax.Array) -> jax.Array:
    """`[1, n]` → `[n, 1]` (the same values)."""
    n = row.shape[1]
    return jnp.sum(jnp.where(_iota(n, 0) == _iota(n, 1), row, 0.0), axis=1, keepdims=True)


def _row(column: jax.Array) -> jax.Array:
    """`[n, 1]` → `[1, n]` (the same values)."""
    n = column.shape[0]
    return jnp.sum(jnp.where(_iota(n, 0) == _iota(n, 1), column, 0.0), axis=0, keepdims=True)


def _cumsum_column(row: jax.Array) -> jax.Array:
    """Σ_{j ≤ t} row_j as a column `[n, 1]`."""
    n = row.shape[1]
    return jnp.sum(jnp.where(_iota(n, 0) >= _iota(n, 1), row, 0.0), axis=1, keepdims=True)


def _reverse_cumsum_row(column: jax.Array) -> jax.Array:
    """Σ_{t' ≥ t} column_t' as a row `[1, n]`."""
    n = column.shape[0]
    return jnp.sum(jnp.where(_iota(n, 0) >= _iota(n, 1), column, 0.0), axis=0, keepdims=True)


def _total(x: jax.Array) -> jax.Array:
    """Σ of a 2-D array as `[1, 1]`."""
    return jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)


# --- one chunk's terms ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Decays:
    """`chunk_math.Chunk` in 2-D: pairs `[C, C]` D_tj = e^{Γ_t − Γ_j} (j ≤ t, one document);
    entry e^{Γ_t} as a column and a row; to_end e^{Γ_last − Γ_t} a column; decay e^{Γ_last}
    `[1, 1]` (each masked by the document counter as there)."""

    pairs: jax.Array
    entry: jax.Array
    entry_row: jax.Array
    to_end: jax.Array
    decay: jax.Array


def _decays(g_row: jax.Array, starts_row: jax.Array | None) -> _Decays:
    n = g_row.shape[1]
    log = _cumsum_column(g_row)  # Γ
    last = jnp.sum(g_row, axis=1, keepdims=True)
    keep = _iota(n, 0) >= _iota(n, 1)
    entry_keep = to_end_keep = decay_keep = None
    if starts_row is not None:
        docs = _cumsum_column(starts_row)  # n_t, documents begun in the chunk up to row t
        docs_last = jnp.sum(starts_row, axis=1, keepdims=True)
        keep &= docs == _row(docs)
        entry_keep, to_end_keep, decay_keep = docs == 0, docs == docs_last, docs_last == 0
    entry = masked_exp(log, entry_keep)
    return _Decays(masked_exp(log - _row(log), keep), entry, _row(entry),
                   masked_exp(last - log, to_end_keep), masked_exp(last, decay_keep))


def _inverse(a: jax.Array, op) -> jax.Array:
    """(I + a)⁻¹ of a strictly lower triangular float32 `[n, n]`: the 2 × 2 diagonal blocks in
    closed form ([[1, 0], [x, 1]]⁻¹ = [[1, 0], [−x, 1]]), then the pairwise merges 2 → … → n."""
    n = a.shape[0]
    rows, cols = _iota(n, 0), _iota(n, 1)
    # The lower-left b × b block of every diagonal 2b × 2b block (b a power of two): same bits
    # above b, row's bit b set, column's clear.
    lower_left = lambda b: ((rows ^ cols) < 2 * b) & ((rows & b) != 0) & ((cols & b) == 0)
    t = jnp.where(rows == cols, 1.0, 0.0) - jnp.where(lower_left(1), a, 0.0)
    return merge_diagonal_blocks(a, t, 2, op, lower_left)


@dataclasses.dataclass(frozen=True)
class _Terms:
    """A chunk's state-independent terms: K Kᵀ and Q Kᵀ (float32), β as a column, P = scale·
    (Q Kᵀ) ⊙ D and T = (I + A)⁻¹ (float32), W = T (β e^Γ ⊙ K) (input dtype), U₀ = T (β ⊙ V)
    (float32)."""

    kk: jax.Array
    qk: jax.Array
    beta: jax.Array
    p: jax.Array
    t: jax.Array
    w: jax.Array
    u0: jax.Array


def _terms(q, k, v, beta_row, decays: _Decays, scale: float) -> _Terms:
    """As `forward._prepare_kernel` makes them (the row scales on T's columns, U₀'s T split in
    two: NOTES.md, Precision)."""
    op = k.dtype
    kk, qk = mm_nt(k, k), mm_nt(q, k)
    n = kk.shape[0]
    beta = _column(beta_row)
    a = jnp.where(_iota(n, 0) > _iota(n, 1), beta * kk * decays.pairs, 0.0)
    t = _inverse(a, op)
    w = mm((t * (beta_row * decays.entry_row)).astype(op), k).astype(op)
    return _Terms(kk, qk, beta, scale * qk * decays.pairs, t, w, split_rows(t * beta_row, v))


# --- the kernels ------------------------------------------------------------------------------


def _params():
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def _interpret(st: Static):
    return pltpu.InterpretParams() if st.interpret else False


class _Specs:
    """Blocks of grid (batch, head, step), chunk = step (or NC − 1 − step if `reverse`)."""

    def __init__(self, chunk: int, num_chunks: int, *, reverse: bool):
        self.C = chunk
        self.at = (lambda c: num_chunks - 1 - c) if reverse else (lambda c: c)

    def rows(self, dim: int) -> pl.BlockSpec:
        """This chunk's rows of a `[B, H, Tp, dim]` array."""
        return pl.BlockSpec((None, None, self.C, dim), lambda b, h, c: (b, h, self.at(c), 0))

    def steps(self) -> pl.BlockSpec:
        """This chunk's `(1, C)` row of a `[B, H, NC, 1, C]` array."""
        return pl.BlockSpec((None, None, None, 1, self.C),
                            lambda b, h, c: (b, h, self.at(c), 0, 0))

    def starts(self) -> pl.BlockSpec:
        """This chunk's `(1, C)` row of the `[B, NC, 1, C]` document starts."""
        return pl.BlockSpec((None, None, 1, self.C), lambda b, h, c: (b, self.at(c), 0, 0))

    @staticmethod
    def state(key_dim: int, value_dim: int) -> pl.BlockSpec:
        """The `[K, V]` state of a `[B, H, K, V]` array (resident across the chunks)."""
        return pl.BlockSpec((None, None, key_dim, value_dim), lambda b, h, c: (b, h, 0, 0))

    def chunk_state(self, key_dim: int, value_dim: int) -> pl.BlockSpec:
        """The state entering this chunk in a `[B, H, NC, K, V]` array."""
        return pl.BlockSpec((None, None, None, key_dim, value_dim),
                            lambda b, h, c: (b, h, self.at(c), 0, 0))

    def inputs(self, key_dim: int, value_dim: int, documents: bool) -> list:
        """q, k, v, g, β and, with documents, the starts."""
        return ([self.rows(key_dim), self.rows(key_dim), self.rows(value_dim), self.steps(),
                 self.steps()] + [self.starts()] * documents)


def _forward_kernel(*refs, st: Static, num_chunks: int, save: bool):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, rest = split_refs(refs, 5, st.documents)
    init_ref, o_ref, final_ref, *rest = rest
    states_ref, state_ref = rest if save else (None, *rest)
    c = pl.program_id(2)

    @pl.when(c == 0)
    def _():
        state_ref[...] = init_ref[...]

    k = k_ref[...]
    op = k.dtype
    decays = _decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    terms = _terms(q_ref[...], k, v_ref[...], beta_ref[...], decays, st.scale)
    state = state_ref[...]
    state_op = state.astype(op)
    if save:
        states_ref[...] = state_op
    u_op = (terms.u0 - mm(terms.w, state_op)).astype(op)
    o_ref[...] = ((st.scale * decays.entry) * mm(q_ref[...], state_op)
                  + mm(terms.p.astype(op), u_op)).astype(o_ref.dtype)
    state = decays.decay * state + mm_tn((k * decays.to_end).astype(op), u_op)
    state_ref[...] = state

    @pl.when(c == num_chunks - 1)
    def _():
        final_ref[...] = state


def forward(q, k, v, g, beta, starts, initial_state, st: Static, *, save: bool):
    """q, k `[B, H, Tp, K]`, v `[B, H, Tp, V]`, g, β `[B, H, NC, 1, C]` float32, starts
    `[B, NC, 1, C]` float32 or None, initial state `[B, H, K, V]` float32. Returns o (q's
    dtype), the final state (float32) and, with `save`, the state entering each chunk
    `[B, H, NC, K, V]` (input dtype)."""
    batch, heads, length, key_dim = q.shape
    value_dim, C = v.shape[-1], st.blocks.chunk
    num_chunks = length // C
    specs = _Specs(C, num_chunks, reverse=False)
    out_specs = [specs.rows(value_dim), specs.state(key_dim, value_dim)]
    out_shape = [jax.ShapeDtypeStruct(v.shape, q.dtype),
                 jax.ShapeDtypeStruct(initial_state.shape, F32)]
    if save:
        out_specs.append(specs.chunk_state(key_dim, value_dim))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, num_chunks, key_dim, value_dim),
                                              q.dtype))
    return pallas_call(
        functools.partial(_forward_kernel, st=st, num_chunks=num_chunks, save=save),
        grid=(batch, heads, num_chunks),
        in_specs=specs.inputs(key_dim, value_dim, st.documents)
        + [specs.state(key_dim, value_dim)],
        out_specs=out_specs, out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((key_dim, value_dim), F32)], compiler_params=_params(),
        interpret=_interpret(st), name="gated_delta_rule_tpu_forward",
    )(q, k, v, g, beta, *([starts] if st.documents else []), initial_state)


def _backward_kernel(*refs, st: Static, num_chunks: int):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, rest = split_refs(refs, 5, st.documents)
    (states_ref, do_ref, d_final_ref, dq_ref, dk_ref, dv_ref, dbeta_ref, dg_ref, d_initial_ref,
     d_state_ref) = rest
    i = pl.program_id(2)

    @pl.when(i == 0)
    def _():
        d_state_ref[...] = d_final_ref[...]

    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    op = k.dtype
    decays = _decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    terms = _terms(q, k, v, beta_ref[...], decays, st.scale)
    beta, pairs = terms.beta, decays.pairs
    s0 = states_ref[...]  # the state entering the chunk, as the forward rounded it
    u_op = (terms.u0 - mm(terms.w, s0)).astype(op)
    d_state = d_state_ref[...]  # dS₁: the gradient of the state after the chunk
    keys = (k * decays.to_end).astype(op)  # K̃ as the forward rounds it
    du_op = (mm_tn(terms.p.astype(op), do) + mm(keys, d_state.astype(op))).astype(op)
    queries = (q * (st.scale * decays.entry)).astype(op)
    d_state_ref[...] = (decays.decay * d_state + mm_tn(queries, do) - mm_tn(terms.w, du_op))

    @pl.when(i == num_chunks - 1)
    def _():
        d_initial_ref[...] = d_state_ref[...]

    # The chunk's gradients (`gradients.py`): with R = (I + A) U, dR = Tᵀ dU.
    n = pairs.shape[0]
    strict = _iota(n, 0) > _iota(n, 1)
    d_r = mm_tn(terms.t.astype(op), du_op)
    d_r_op = d_r.astype(op)
    dv_ref[...] = (beta * d_r).astype(dv_ref.dtype)
    d_beta = jnp.sum(d_r * v.astype(F32), axis=1, keepdims=True)
    d_a = -mm_nt(d_r_op, u_op)
    d_a_kk = jnp.where(strict, d_a * terms.kk * pairs, 0.0)  # A = β (K Kᵀ) ⊙ D
    d_beta += jnp.sum(d_a_kk, axis=1, keepdims=True)
    d_kk = beta * jnp.where(strict, d_a * pairs, 0.0)
    d_kk = (d_kk + d_kk.T).astype(op)  # K Kᵀ has k on both sides
    d_qk = st.scale * mm_nt(do, u_op) * pairs  # P = scale (Q Kᵀ) ⊙ D
    from_pairs = beta * d_a_kk + d_qk * terms.qk  # dA ⊙ A + dP ⊙ P: row t gains, column j loses
    d_log = (jnp.sum(from_pairs, axis=1, keepdims=True)
             - _column(jnp.sum(from_pairs, axis=0, keepdims=True)))
    d_qk = d_qk.astype(op)
    d_q = mm_nt(do, s0)  # dQ̃ = dO S₀ᵀ
    q_q = jnp.sum(d_q * q.astype(F32), axis=1, keepdims=True)
    dq_ref[...] = ((st.scale * decays.entry) * d_q + mm(d_qk, k)).astype(dq_ref.dtype)
    d_x = -mm_nt(d_r_op, s0)  # X = β e^Γ ⊙ K
    x_k = jnp.sum(d_x * k.astype(F32), axis=1, keepdims=True)
    # dK̃ = U dS₁ᵀ with the float32 dS₁ split in two operands (≈ float32 accuracy, NOTES.md).
    ds1_hi = d_state.astype(op)
    d_k = mm_nt(u_op, ds1_hi)
    if op != F32:
        d_k += mm_nt(u_op, (d_state - ds1_hi.astype(F32)).astype(op))
    through_end = decays.to_end * jnp.sum(d_k * k.astype(F32), axis=1, keepdims=True)
    dk_ref[...] = ((beta * decays.entry) * d_x + decays.to_end * d_k + mm_tn(d_qk, q)
                   + mm(d_kk, k)).astype(dk_ref.dtype)
    # Γ_last: through K̃'s to_end and the entering state's decay e^{Γ_last}.
    to_last = decays.decay * _total(d_state * s0.astype(F32)) + _total(through_end)
    last = lax.broadcasted_iota(jnp.int32, (n, 1), 0) == n - 1
    d_log += (decays.entry * (st.scale * q_q + beta * x_k) - through_end
              + jnp.where(last, to_last, 0.0))
    dbeta_ref[...] = _row(d_beta + decays.entry * x_k)
    dg_ref[...] = _reverse_cumsum_row(d_log)


def backward(q, k, v, g, beta, starts, states, d_out, d_final, st: Static):
    """Arrays as `forward` takes them, `states` its saved entering states, d_out `[B, H, Tp,
    V]` (q's dtype), d_final `[B, H, K, V]` float32. Returns dq, dk, dv (input dtype), dβ, dg
    `[B, H, NC, 1, C]` and the initial state's gradient `[B, H, K, V]` (float32)."""
    batch, heads, length, key_dim = q.shape
    value_dim, C = v.shape[-1], st.blocks.chunk
    num_chunks = length // C
    specs = _Specs(C, num_chunks, reverse=True)
    state = specs.state(key_dim, value_dim)
    return pallas_call(
        functools.partial(_backward_kernel, st=st, num_chunks=num_chunks),
        grid=(batch, heads, num_chunks),
        in_specs=specs.inputs(key_dim, value_dim, st.documents)
        + [specs.chunk_state(key_dim, value_dim), specs.rows(value_dim), state],
        out_specs=[specs.rows(key_dim), specs.rows(key_dim), specs.rows(value_dim),
                   specs.steps(), specs.steps(), state],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(g.shape, F32),
                   jax.ShapeDtypeStruct(g.shape, F32), jax.ShapeDtypeStruct(d_final.shape, F32)],
        scratch_shapes=[pltpu.VMEM((key_dim, value_dim), F32)], compiler_params=_params(),
        interpret=_interpret(st), name="gated_delta_rule_tpu_backward",
    )(q, k, v, g, beta, *([starts] if st.documents else []), states, d_out, d_final)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(st: Static, q, k, v, g, beta, starts, initial_state):
    return tuple(forward(q, k, v, g, beta, starts, initial_state, st, save=False))


def _core_forward(st: Static, q, k, v, g, beta, starts, initial_state):
    out, final_state, states = saved(*forward(q, k, v, g, beta, starts, initial_state, st,
                                              save=True))
    return (out, final_state), (q, k, v, g, beta, starts, states)


def _core_backward(st: Static, residuals, cotangents):
    q, k, v, g, beta, starts, states = residuals
    d_out, d_final = cotangents
    dq, dk, dv, d_beta, dg, d_initial = backward(q, k, v, g, beta, starts, states,
                                                 d_out.astype(q.dtype), d_final.astype(F32), st)
    return dq, dk, dv, dg, d_beta, None, d_initial


_core.defvjp(_core_forward, _core_backward)


def gated_delta_rule(st: Static, q, k, v, g, beta, starts, initial_state):
    """The TPU kernels on the arrays `api.gated_delta_rule` prepares: q, k `[B, Tp, H, K]`,
    v `[B, Tp, H, V]` (Tp a multiple of the chunk), g, β `[B, H, Tp]` float32, starts `[B, Tp]`
    float32 or None, initial state `[B, H, K, V]` float32. Returns (o `[B, Tp, H, V]` in q's
    dtype, final state float32); differentiable in every array but the starts."""
    C = st.blocks.chunk
    heads_first = lambda x: x.transpose(0, 2, 1, 3)  # [B, Tp, H, D] ↔ [B, H, Tp, D]
    by_chunk = lambda x: x.reshape(x.shape[:-1] + (x.shape[-1] // C, 1, C))
    out, final_state = _core(st, heads_first(q), heads_first(k), heads_first(v), by_chunk(g),
                             by_chunk(beta), None if starts is None else by_chunk(starts),
                             initial_state)
    return heads_first(out), final_state
