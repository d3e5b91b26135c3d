"""The argument checks the flash-attention entry points share (GPU kernels and TPU splash)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

HEAD_DIMS = (64, 128, 256)


def unsupported_arguments(q, k, v, segment_ids, window) -> str | None:
    """None when q, k, v, the segment ids and the window are a causal self-attention call
    (`[B, T, H, D]`, `[B, T, G, D]` with G | H, `[B, T]` integer ids), else what is wrong."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return (f"q, k, v must be [batch, time, heads, head_dim], got shapes {q.shape}, "
                f"{k.shape}, {v.shape}")
    batch, length, heads, head_dim = q.shape
    if 0 in q.shape + k.shape + v.shape:
        return f"q, k, v must not be empty, got shapes {q.shape}, {k.shape}, {v.shape}"
    if k.shape != v.shape or k.shape[:2] != (batch, length) or k.shape[3] != head_dim:
        return (f"k and v must both be [B, T, G, D] = [{batch}, {length}, G, {head_dim}] "
                f"(self-attention, value dim = head dim), got {k.shape} and {v.shape}")
    if heads % k.shape[2]:
        return f"kv heads {k.shape[2]} must divide query heads {heads}"
    if segment_ids is not None and (segment_ids.shape != (batch, length)
                                    or not jnp.issubdtype(segment_ids.dtype, jnp.integer)):
        return (f"segment_ids must be integer [B, T] = [{batch}, {length}], got "
                f"{segment_ids.dtype} {segment_ids.shape}")
    if window is not None and (not isinstance(window, int | np.integer) or window < 1):
        return f"window must be >= 1 (an int) or None, got {window!r}"
    return None


def unsupported_on(platform: str, q, k, v, dtypes) -> str | None:
    """None when the head dim is one of `HEAD_DIMS` and q, k, v all have one of `dtypes`."""
    if q.shape[-1] not in HEAD_DIMS:
        return f"head_dim must be one of {HEAD_DIMS} on the {platform}, got {q.shape[-1]}"
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        names = "/".join(jnp.dtype(d).name for d in dtypes)
        return f"needs {names} q, k, v on the {platform}, got {q.dtype}, {k.dtype}, {v.dtype}"
    return None
