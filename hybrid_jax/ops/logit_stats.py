"""Per-row statistics of logits that the cross-entropy loss and the accuracy need
(`hybrid_jax.train.loss`): for each row l `[V]` and target t,

    top = max l (NaN counts as the largest),  best = its first index (jnp.argmax),
    sum_exp = Σ exp(l − shift) with shift = top where finite, else 0,
    target_logit = l[t] (jnp.take_along_axis's index rule: t < 0 counts from the end, NaN
                   outside [−V, V)).

Rungs: "pallas" (`pallas_kernels/logit_stats`: one read of the logits, an online softmax;
GPUs only) and "xla" (an argmax reduction, then Σ exp: two reads of the `[tokens, V]` float32
logits, the largest arrays of a small model's step; one XLA pass, a variadic `lax.reduce` of
the maximum, its index and the rescaled Σ exp, was measured and did not pay: 2.00 ms against
1.08 + 0.96 for the two at the 125M shape, its exponentials and selects making the reduction
compute-bound at 2.1 TB/s, H200, 2026-12-02). The pallas rung runs on each device's
batch rows and sequence shard; where a mesh splits the vocabulary (`tensor` > 1) it refuses
and the XLA rung reduces the shards in place. Not differentiable: the loss has its own
VJP from the logits and these statistics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_jax.ops.checks import check_floating, check_integer
from hybrid_jax.ops.dispatch import Rung, dispatch
from hybrid_jax.ops.partition import row_layout, shard_kernel
from pallas_kernels.logit_stats import api as pallas_logit_stats
from pallas_kernels.logit_stats.api import LogitStats

_OP = "logit_stats"
_VOCAB_AXIS = "tensor"  # where the rule table splits the vocabulary


def logit_stats(logits: jax.Array, targets: jax.Array, *,
                implementation: str | None = None) -> LogitStats:
    """`LogitStats(top, best, sum_exp, target_logit)` of logits `[..., V]` against integer
    targets `[...]` (module docstring); float32 values, int32 `best`, each `[...]`."""
    check_floating(_OP, logits=logits)
    check_integer(_OP, targets=targets)
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"{_OP}: targets must have the logits' leading shape "
                         f"{tuple(logits.shape[:-1])} (logits {tuple(logits.shape)}), got "
                         f"{tuple(targets.shape)}")
    return dispatch(_OP, _RUNGS, implementation, logits, targets)


def logit_stats_xla(logits: jax.Array, targets: jax.Array) -> LogitStats:
    """The row maximum from the argmax's reduction (its logit), then Σ exp."""
    logits = logits.astype(jnp.float32)
    best = jnp.argmax(logits, axis=-1)
    top = jnp.take_along_axis(logits, best[..., None], axis=-1)[..., 0]
    shift = lax.select(jnp.isfinite(top), top, jnp.zeros_like(top))
    sum_exp = jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return LogitStats(top, best.astype(jnp.int32), sum_exp, target_logit)


def logit_stats_pallas(logits: jax.Array, targets: jax.Array) -> LogitStats:
    """The kernel on each device's batch rows and sequence shard (rows are independent)."""
    rows = row_layout(logits.ndim - 1)
    return shard_kernel(_OP, pallas_logit_stats.logit_stats, (logits, targets),
                        (rows + "V", rows), LogitStats(*(rows,) * 4))


def _pallas_unsupported(logits: jax.Array, targets: jax.Array) -> str | None:
    mesh = jax.sharding.get_abstract_mesh()
    axis = _VOCAB_AXIS
    if (not mesh.empty and axis in mesh.axis_names and axis not in mesh.manual_axes
            and mesh.shape[axis] > 1):
        return (f"the mesh splits {axis} ({mesh.shape[axis]} devices), over which the logits' "
                "vocabulary is split, and the kernel reduces whole rows")
    return pallas_logit_stats.unsupported(logits, targets)


_RUNGS = (
    # H200 (session 23, `experiments/benchmarks/logit_stats.py`): 1.6-1.8x the XLA rung at
    # [32768, 32000 / 32768], 1.3x the logits' read (pallas_kernels/logit_stats/NOTES.md).
    Rung("pallas", logit_stats_pallas, _pallas_unsupported, platforms=("gpu",)),
    Rung("xla", logit_stats_xla),
)
