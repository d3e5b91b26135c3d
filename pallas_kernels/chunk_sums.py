"""Within-chunk inclusive sums, made in XLA before the serial kernels (as fla's
`chunk_local_cumsum`), so that their loops over chunks read them instead of scanning: the
cumulative log decay of the gated delta rule and of SSD, and the gated delta rule's document
counter."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def chunk_cumsum(x: jax.Array, C: int) -> jax.Array:
    """Σ_{l ≤ t} x_l within each chunk of C steps of `[..., Tp]` x (Tp a multiple of C)."""
    return jnp.cumsum(x.reshape(x.shape[:-1] + (-1, C)), axis=-1).reshape(x.shape)
