"""The definition the kernels are tested against: every query against every key, float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def visible(rows: jax.Array, cols: jax.Array, row_segments: jax.Array, col_segments: jax.Array,
            window: int | None) -> jax.Array:
    """Key `cols` is visible from query `rows`: causal, within the window (t − w < s ≤ t) and
    in the same document. Broadcasts its arguments."""
    mask = (cols <= rows) & (row_segments == col_segments)
    if window is not None:
        mask &= rows - cols < window
    return mask


def flash_attention_reference(q, k, v, segment_ids, *, window, scale):
    """`[B, T, H, D]` queries, `[B, T, G, D]` keys/values (G | H), `[B, T]` segment ids."""
    dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2).astype(dtype)
    v = jnp.repeat(v, group, axis=2).astype(dtype)
    logits = scale * jnp.einsum("bthd,bshd->bhts", q.astype(dtype), k)
    positions = jnp.arange(q.shape[1])
    mask = visible(positions[:, None], positions[None, :], segment_ids[:, None, :, None],
                   segment_ids[:, None, None, :], window)
    probs = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", probs, v).astype(q.dtype)
