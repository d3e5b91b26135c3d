"""The static part of one call of the gated delta rule kernels, and the launch helpers."""

from __future__ import annotations

import dataclasses

from jax.experimental.pallas import triton as pltriton

from pallas_kernels.delta_rule.block_sizes import BlockSizes


@dataclasses.dataclass(frozen=True)
class Static:
    """Hashable (a `custom_vjp` nondiff argument). scale: the query scale; documents: the call
    has document starts (the kernels take a starts array and mask by it); interpret: Pallas
    interpret mode (CPU tests)."""

    scale: float
    blocks: BlockSizes
    documents: bool
    interpret: bool


def compiler_params(num_warps: int, num_stages: int):
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
