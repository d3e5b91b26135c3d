"""Context (sequence) parallelism: every mixer op split along time over the `seq` mesh axis.

Each function here has the signature and result of the op it is named after and is that op
when the current mesh has no `seq` axis of size > 1; otherwise it runs inside `jax.shard_map`
(manual over `seq` only) with the collectives of `collectives.py`:

* linear recurrences: per-shard affine maps of the entering state, combined across shards,
  then each shard reruns from its true entering state (`recurrences.py`);
* softmax attention: all-gathered K/V, or a halo for sliding windows (`attention.py`);
* native hybrid attention: both, with the slot inputs shifted by w across shards (`nha.py`);
* short convolutions: a halo of the previous tokens (`with_past`, `short_conv.py`).
"""

from hybrid_jax.ops.context_parallel.attention import attention
from hybrid_jax.ops.context_parallel.collectives import (
    COMBINES,
    DEFAULT_COMBINE,
    SEQ_AXIS,
    seq_shards,
    with_past,
)
from hybrid_jax.ops.context_parallel.nha import native_hybrid_attention
from hybrid_jax.ops.context_parallel.recurrences import (
    dss,
    gated_delta_rule,
    gated_slot_attention,
    linear_scan,
    selective_scan,
    ssd,
)
from hybrid_jax.ops.context_parallel.short_conv import short_conv

__all__ = [
    "COMBINES",
    "DEFAULT_COMBINE",
    "SEQ_AXIS",
    "attention",
    "dss",
    "gated_delta_rule",
    "gated_slot_attention",
    "linear_scan",
    "native_hybrid_attention",
    "selective_scan",
    "seq_shards",
    "short_conv",
    "ssd",
    "with_past",
]
