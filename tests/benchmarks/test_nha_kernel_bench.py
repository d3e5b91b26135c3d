"""The NHA kernel benchmark's tile variants are the GPU defaults with fields changed."""

import dataclasses

from experiments.benchmarks import nha_kernel
from pallas_kernels.nha.block_sizes import default_block_sizes


def test_variants_change_the_gpu_defaults():
    defaults = default_block_sizes("gpu", nha_kernel.DIM)
    assert nha_kernel.VARIANTS["default"] == defaults
    for name, blocks in nha_kernel.VARIANTS.items():
        changes = nha_kernel.VARIANT_CHANGES[name]
        assert blocks == dataclasses.replace(defaults, **changes)
        if name != "default":
            assert blocks != defaults, f"variant {name!r} is the defaults"
    distinct = {dataclasses.astuple(b) for b in nha_kernel.VARIANTS.values()}
    assert len(distinct) == len(nha_kernel.VARIANTS), "two variants are the same tiles"
