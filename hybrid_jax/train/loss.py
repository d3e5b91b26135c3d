"""Masked next-token cross entropy and accuracy, in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_stats(logits_BTV: jax.Array, targets_BT: jax.Array, mask_BT: jax.Array
                ) -> dict[str, jax.Array]:
    """Sums over scored positions: `loss_sum`, `correct`, `count` (float32 scalars)."""
    logits = logits_BTV.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets_BT[..., None], axis=-1)[..., 0]
    weights = mask_BT.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == targets_BT).astype(jnp.float32)
    return {
        "loss_sum": jnp.sum((log_z - target_logit) * weights),
        "correct": jnp.sum(correct * weights),
        "count": jnp.sum(weights),
    }


def mean_loss(stats: dict[str, jax.Array]) -> jax.Array:
    return stats["loss_sum"] / jnp.maximum(stats["count"], 1.0)
