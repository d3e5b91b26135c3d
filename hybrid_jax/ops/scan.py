"""Linear-recurrence helpers shared by the recurrent ops (SSD, DSS, gated delta rule, GSA).

Two kinds of state:

* Vector / diagonal state, `h_t = a_t * h_{t−1} + b_t` elementwise (real or complex):
  `linear_scan` runs it over every step with `jax.lax.associative_scan` (log-depth, O(T·d)
  memory, which is the size of its output anyway).
* Matrix-valued state (d_k × d_v per head): never stored per token. The chunked forms compute
  one state increment per chunk and `chunk_scan` / `chunk_state_scan` carry the state from
  chunk to chunk with `lax.scan`, keeping only the state entering each chunk (O(T/C·d_k·d_v)).

Inside a chunk, `causal_decay_matrix` gives the decay between every pair of steps from the
cumulative log decay, masked before `exp` so no `inf·0` reaches values or gradients.
`unit_lower_triangular_inverse` inverts the chunk's `I + A` systems (delta rule) with matmuls
only: jaxlib's CPU triangular solve (`lapack_strsm_ffi`) blocks on XLA's intra-op thread pool
and deadlocks when two solves run at once on a 2-thread pool.
`to_chunks` pads time with zeros (decay exp(0) = 1, no input: padding leaves states unchanged
when the op builds its log decay and inputs from the padded arrays) and folds it into chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels import vma


def compute_dtype(*arrays: jax.Array | None) -> jnp.dtype:
    """The real dtype of recurrent math: float32, or float64 when an input is float64."""
    real_dtypes = [jnp.finfo(x.dtype).dtype for x in arrays if x is not None]
    return jnp.promote_types(jnp.result_type(*real_dtypes), jnp.float32)


def linear_scan(
    a: jax.Array, b: jax.Array, initial_state: jax.Array | None = None, *, axis: int = 1
) -> jax.Array:
    """All states of `h_t = a_t * h_{t−1} + b_t` (elementwise) along `axis`.

    Args:
      a: decays, broadcastable to `b.shape` (e.g. constant over time), real or complex.
      b: inputs, e.g. `[B, T, H, N]` with `axis=1`.
      initial_state: `h_{−1}`, `b.shape` without `axis` (e.g. `[B, H, N]`); None for zeros.
      axis: the time axis.

    Returns:
      `h` with the shape of `b` (dtype of `a·b`); the final state is `h` at the last index
      of `axis`.
    """
    axis = axis % b.ndim
    dtype = jnp.result_type(a, b)
    a = jnp.broadcast_to(a, b.shape).astype(dtype)
    b = b.astype(dtype)
    if initial_state is not None:
        expected = b.shape[:axis] + b.shape[axis + 1:]
        if tuple(initial_state.shape) != expected:  # a broadcastable one passed unnoticed
            raise ValueError(f"linear_scan: initial_state must have shape {expected} (b's "
                             f"{tuple(b.shape)} without axis {axis}), got "
                             f"{tuple(initial_state.shape)}")
        first = jax.lax.index_in_dim(b, 0, axis) + jax.lax.index_in_dim(a, 0, axis) * (
            jnp.expand_dims(initial_state, axis))
        b = jax.lax.dynamic_update_index_in_dim(b, first.astype(dtype), 0, axis)

    def combine(earlier, later):
        a_e, b_e = earlier
        a_l, b_l = later
        return a_l * a_e, a_l * b_e + b_l

    return jax.lax.associative_scan(combine, (a, b), axis=axis)[1]


def varying_scan(step: Callable, initial_state: Any, xs: Any, *closed_over: Any
                 ) -> tuple[Any, Any]:
    """`jax.lax.scan(step, initial_state, xs)`, the state first marked varying over a caller's
    `shard_map` axes as `xs` and the arrays that `step` closes over (`closed_over`) vary: the
    carry leaves the first step as varying as they are, and a loop's carry keeps one type."""
    return jax.lax.scan(step, vma.varying_like(initial_state, xs, *closed_over), xs)


def chunk_scan(
    update: Callable[[Any, Any], Any], initial_state: Any, inputs: Any, *, axis: int = 1
) -> tuple[Any, Any]:
    """Carries a state across chunks: `state_{c+1} = update(state_c, inputs_c)`.

    For chunked forms whose chunk-to-chunk transition is not elementwise (e.g. the gated delta
    rule, `S ← γ S + K̃ᵀ(U − W S)`); `chunk_state_scan` covers elementwise decays.

    Args:
      update: `(state, inputs_c) -> next state`, where `inputs_c` is `inputs` with the chunk
        axis removed. The state keeps its shape and dtype.
      initial_state: the state entering chunk 0 (a pytree of arrays, e.g. `[B, H, K, V]`).
      inputs: a pytree of arrays with the chunk axis at `axis` (e.g. `[B, NC, H, K, V]`).
      axis: the chunk axis of every input leaf and of the returned entering states.

    Returns:
      `(entering, final)`: the state entering each chunk, stacked at `axis` (e.g.
      `[B, NC, H, K, V]`), and the state after the last chunk.
    """
    to_front = jax.tree.map(lambda x: jnp.moveaxis(x, axis, 0), inputs)

    def step(state, inputs_c):
        return update(state, inputs_c), state

    final, entering = varying_scan(step, initial_state, to_front)
    return jax.tree.map(lambda x: jnp.moveaxis(x, 0, axis), entering), final


def chunk_state_scan(
    decay: jax.Array,
    increment: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    axis: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """`S_{c+1} = decay_c * S_c + increment_c` over chunks, for matrix-valued states.

    Args:
      decay: the decay across a whole chunk, of the rank of `increment` with the same chunk
        axis, other axes broadcastable (size 1): a scalar per head `[B, NC, H, 1, 1]`, a
        per-row `[B, NC, H, K, 1]` or a per-column `[B, NC, H, 1, V]` factor.
      increment: the contribution of each chunk's own tokens to the state at its end,
        `[B, NC, H, K, V]` (chunk axis at `axis`).
      initial_state: `[B, H, K, V]` (increment without the chunk axis); None for zeros.
      axis: the chunk axis.

    Returns:
      `(entering, final)`: the state entering each chunk `[B, NC, H, K, V]` and the final state
      `[B, H, K, V]`, in the dtype of `increment`.
    """
    axis = axis % increment.ndim
    if initial_state is None:
        initial_state = jnp.zeros(increment.shape[:axis] + increment.shape[axis + 1:],
                                  increment.dtype)
    return chunk_scan(
        lambda state, di: (di[0] * state + di[1]).astype(increment.dtype),
        initial_state.astype(increment.dtype),
        (decay, increment),
        axis=axis,
    )


def causal_decay_matrix(cum_log_decay: jax.Array) -> jax.Array:
    """`exp(c_t − c_s)` for `s ≤ t`, else 0, over the last axis of `cum_log_decay` `[..., L]`.

    `c` is the within-chunk cumulative sum of log decays, so the entry is the product of the
    decays of steps s+1..t. Returns `[..., L(t), L(s)]`. The mask goes in before `exp`: the
    upper triangle would be `exp(positive)` and could overflow.
    """
    length = cum_log_decay.shape[-1]
    diff = cum_log_decay[..., :, None] - cum_log_decay[..., None, :]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    return jnp.exp(jnp.where(causal, diff, -jnp.inf))


_SUBSTITUTION_BLOCK = 16


def unit_lower_triangular_inverse(a: jax.Array) -> jax.Array:
    """`(I + A)⁻¹` for strictly lower-triangular `A` `[..., n, n]` (the upper triangle and the
    diagonal of `a` are ignored), without a LAPACK call.

    Row-by-row forward substitution on diagonal blocks of 16, then block doubling:
    `[[A₁₁, 0], [A₂₁, A₂₂]]` inverts to `[[T₁₁, 0], [−T₂₂ A₂₁ T₁₁, T₂₂]]`, the two halves
    inverted together as one batch. This is exact forward substitution reordered (no power
    series, whose terms can grow as binomials), with its matmuls at full float32 precision.
    `n` is zero-padded to `16·2^k`; padding is the identity and is sliced off.
    """
    n = a.shape[-1]
    a = jnp.tril(a, -1)
    block = min(n, _SUBSTITUTION_BLOCK)
    padded = block * 2 ** max(0, math.ceil(math.log2(n / block)))
    if padded != n:
        a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, padded - n)] * 2)
    return _inverse_by_halves(a, block)[..., :n, :n]


def _inverse_by_halves(a: jax.Array, block: int) -> jax.Array:
    n = a.shape[-1]
    if n <= block:
        return _forward_substitution(a)
    h = n // 2
    halves = _inverse_by_halves(jnp.stack([a[..., :h, :h], a[..., h:, h:]]), block)
    upper, lower = halves[0], halves[1]
    below = -_matmul(lower, _matmul(a[..., h:, :h], upper))
    top = jnp.concatenate([upper, jnp.zeros_like(below.swapaxes(-1, -2))], axis=-1)
    return jnp.concatenate([top, jnp.concatenate([below, lower], axis=-1)], axis=-2)


def _forward_substitution(a: jax.Array) -> jax.Array:
    """Row i of `T = (I + A)⁻¹` is `e_i − A[i] T` once rows < i are final (A[i, j≥i] = 0)."""
    n = a.shape[-1]
    # `+ zeros_like(a)` gives the carry `a`'s varying mesh axes (inside a context-parallel
    # shard_map the loop's carry must match its body's output).
    eye = jnp.eye(n, dtype=a.dtype) + jnp.zeros_like(a)

    def row(i, t):
        a_i = jax.lax.dynamic_index_in_dim(a, i, axis=-2)  # [..., 1, n]
        e_i = jax.lax.dynamic_index_in_dim(eye, i, axis=-2)
        return jax.lax.dynamic_update_index_in_dim(t, e_i - _matmul(a_i, t), i, axis=-2)

    return jax.lax.fori_loop(1, n, row, eye)


def _matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)


def to_chunks(x: jax.Array, chunk_size: int, *, axis: int = 1) -> jax.Array:
    """Zero-pads `axis` to a multiple of `chunk_size` and splits it into `[NC, chunk_size]`.

    E.g. `[B, T, H, D] -> [B, NC, C, H, D]` with `axis=1`.
    """
    axis = axis % x.ndim
    length = x.shape[axis]
    num_chunks = -(-length // chunk_size)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, num_chunks * chunk_size - length)
    x = jnp.pad(x, pad)
    return x.reshape(x.shape[:axis] + (num_chunks, chunk_size) + x.shape[axis + 1:])


def time_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
    """`[B, T, H, ...] -> [NC, B, H, C, ...]`: chunks first (for `lax.scan`), zero-padded.

    Zero padding is neutral for the recurrences here: a padded step has log decay 0 and writes
    nothing (β = 0 / s = 0), so the state passes through it unchanged.
    """
    return jnp.swapaxes(jnp.moveaxis(to_chunks(x, chunk_size), 1, 0), 2, 3)


def from_time_chunks(x: jax.Array, length: int) -> jax.Array:
    """`[NC, B, H, C, ...] -> [B, T, H, ...]`, dropping the padding beyond `length`."""
    x = jnp.moveaxis(jnp.swapaxes(x, 2, 3), 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]
