"""The static part of one call of the gated delta rule kernels."""

from __future__ import annotations

import dataclasses

from pallas_kernels.delta_rule.block_sizes import BlockSizes


@dataclasses.dataclass(frozen=True)
class Static:
    """Hashable (a `custom_vjp` nondiff argument). scale: the query scale; documents: the call
    has document starts (the kernels take a starts array and mask by it); interpret: Pallas
    interpret mode (CPU tests); key_group: value heads per key head (q, k, g, β and the
    per-chunk W, P, T have H / key_group heads, and head h of v, U and the state reads key
    head h // key_group through the block index maps: the V slices of a wide V share them)."""

    scale: float
    blocks: BlockSizes
    documents: bool
    interpret: bool
    key_group: int = 1
