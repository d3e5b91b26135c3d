"""Per-row statistics of logits for the cross-entropy loss and the accuracy, with a Pallas
kernel: one read of the `[..., V]` logits instead of XLA's two reductions.

For each row l (of length V) and its target t:

    top          = max l, NaN where the row has a NaN (NaN counts as the largest)
    best         = the first index of top (of the first NaN)          (jnp.argmax's index)
    sum_exp      = Σ_j exp(l_j − shift),  shift = top where finite, else 0
    target_logit = l[t]; a negative t counts from the end; t outside [−V, V) gives NaN
                   (`jnp.take_along_axis`'s index rule)

Values are those of the XLA forms up to the order of the float32 sums: the kernel keeps Σ exp
relative to the running maximum and rescales it when the maximum grows (an online softmax).
This is the contract of `hybrid_jax.ops.logit_stats`, whose "pallas" rung calls it. Not
differentiable (the loss's custom VJP differentiates from the logits and these statistics).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.gpu_elementwise import unsupported_arrays
from pallas_kernels.logit_stats import gpu
from pallas_kernels.logit_stats.block_sizes import BlockSizes

MAX_INDEX = 2**31 - 1  # column and row indices are int32


class LogitStats(NamedTuple):
    """Each of the logits' leading shape: top, sum_exp, target_logit float32; best int32."""

    top: jax.Array
    best: jax.Array
    sum_exp: jax.Array
    target_logit: jax.Array


def logit_stats(logits: jax.Array, targets: jax.Array, *, block_sizes: BlockSizes | None = None,
                interpret: bool = False) -> LogitStats:
    """The statistics (module docstring) of logits `[..., V]` against integer targets `[...]`.

    Args:
      logits: `[..., V]`, any float dtype (read as float32).
      targets: `[...]` integer, the logits' leading shape.
      block_sizes: tiles (default `BlockSizes()`).
      interpret: run the kernel in Pallas interpret mode (CPU tests).
    """
    reason = unsupported(logits, targets, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas logit_stats: {reason}")
    st = gpu.Static(blocks=block_sizes or BlockSizes(), interpret=interpret)
    lead = logits.shape[:-1]
    flat = gpu.logit_stats(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), st)
    return LogitStats(*(x.reshape(lead) for x in flat))


def unsupported(logits, targets, *, interpret: bool = False) -> str | None:
    """None when the kernel can run this call, else what is wrong (shapes, dtypes, platform)."""
    if logits.ndim < 1 or logits.shape[-1] < 1:
        return f"expected logits [..., V] with V >= 1, got shape {tuple(logits.shape)}"
    if logits.size == 0:
        return f"logits must have at least one row, got shape {tuple(logits.shape)}"
    if targets.shape != logits.shape[:-1]:
        return (f"targets must have the logits' leading shape {tuple(logits.shape[:-1])}, got "
                f"{tuple(targets.shape)}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        return f"targets must be integers, got {targets.dtype}"
    if logits.shape[-1] >= MAX_INDEX or targets.size >= MAX_INDEX:
        return f"at most {MAX_INDEX - 1} rows and columns (int32 indices), got {logits.shape}"
    return unsupported_arrays(dict(logits=logits), interpret)
