"""Masked next-token cross entropy and accuracy, in float32.

The `[tokens, vocab]` float32 logits are the largest arrays of a small model's step (4 GiB for
32768 tokens × 32768 words), so the loss touches them as few times as it can: the forward reads
them once for the per-row statistics (`hybrid_jax.ops.logit_stats`: the maximum, its index,
Σ exp and the target's logit; a one-pass kernel on GPUs, two XLA reductions elsewhere), and its
backward (`custom_vjp`) is one elementwise pass, `(softmax − onehot) · weight · ḡ` from the
logits and the two saved per-token sums. Differentiated as written (logsumexp,
take_along_axis, argmax), the forward read them three times and the backward built a zero
array, scattered into it and added a second one (H200, 125M, 2026-12-01: ~8 ms of
[tokens, vocab] passes per step). Values and gradients are the plain ones up to the order of
the float32 sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_jax.ops.logit_stats import logit_stats


def token_stats(logits_BTV: jax.Array, targets_BT: jax.Array, mask_BT: jax.Array
                ) -> dict[str, jax.Array]:
    """Sums over scored positions: `loss_sum`, `correct`, `count` (float32 scalars).

    An unscored target may be any integer (e.g. -100 padding): it is never read. A scored one
    outside `[0, vocab)` makes the loss NaN (the trainer refuses a non-finite loss), a negative
    one too (not an index from the end)."""
    if mask_BT.shape != targets_BT.shape:  # else it broadcasts: a wrong count, no error
        raise ValueError(f"token_stats: mask must have the targets' shape "
                         f"{tuple(targets_BT.shape)}, got {tuple(mask_BT.shape)}")
    weights = mask_BT.astype(jnp.float32)
    # `logit_stats` reads a target t < 0 from the end (a scored -1 was the last word's loss)
    # and gives NaN for t outside [-V, V), which the weight 0 of an unscored one kept (NaN · 0):
    # unscored -100 padding made the loss NaN at vocabularies under 100. Unscored ones read 0,
    # scored ones V (NaN). In-range unscored targets stay (the weights' gradient reads them).
    vocab = logits_BTV.shape[-1]
    outside = (targets_BT < 0) | (targets_BT >= vocab)
    targets_BT = jnp.where(outside, jnp.where(weights == 0, 0, vocab), targets_BT)
    loss_sum, correct = _scored_sums(logits_BTV.astype(jnp.float32), targets_BT, weights)
    return {"loss_sum": loss_sum, "correct": correct, "count": jnp.sum(weights)}


def mean_loss(stats: dict[str, jax.Array]) -> jax.Array:
    return stats["loss_sum"] / jnp.maximum(stats["count"], 1.0)


def _forward(logits, targets, weights):
    """The sums and the per-token terms the backward needs (logsumexp as `jax.nn.logsumexp`)."""
    stats = logit_stats(logits, targets)
    shift = lax.select(jnp.isfinite(stats.top), stats.top, jnp.zeros_like(stats.top))
    nll = jnp.log(stats.sum_exp) + shift - stats.target_logit
    hit = (stats.best == targets).astype(jnp.float32)
    sums = (jnp.sum(nll * weights), jnp.sum(hit * weights))
    return sums, (logits, targets, weights, shift, stats.sum_exp, nll, hit)


@jax.custom_vjp
def _scored_sums(logits, targets, weights):
    return _forward(logits, targets, weights)[0]


def _scored_sums_bwd(residuals, cotangents):
    logits, targets, weights, shift, sum_exp, nll, hit = residuals
    # Else XLA merges this exp with the forward's and keeps the float32 [tokens, vocab] result
    # alive from the forward to here: one more 4 GiB array at the 125M shape.
    logits = lax.optimization_barrier(logits)
    g_loss, g_correct = cotangents
    g = g_loss * weights  # per token; `correct` is flat in the logits
    vocab = lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
    softmax_part = jnp.exp(logits - shift[..., None]) * (g / sum_exp)[..., None]
    d_logits = softmax_part - jnp.where(vocab == targets[..., None], g[..., None], 0.0)
    return d_logits, None, nll * g_loss + hit * g_correct


_scored_sums.defvjp(_forward, _scored_sums_bwd)
