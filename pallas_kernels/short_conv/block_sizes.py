"""Tile sizes and launch parameters of the short-convolution kernels."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles (powers of two) and Triton launch parameters of the two kernels.

    forward: a program convolves `block_t` time steps × `block_c` channels of one batch row;
      num_warps.
    backward: a program runs `backward_steps` loop steps of `backward_block_t` time steps ×
      `backward_block_c` channels (its weight-gradient partial sums stay in registers over the
      steps, so fewer programs write fewer partials); backward_num_warps, backward_num_stages
      (the loop's software pipelining).
    """

    block_t: int = 64
    block_c: int = 128
    num_warps: int = 4
    backward_block_t: int = 16
    backward_block_c: int = 128
    backward_steps: int = 8
    backward_num_warps: int = 4
    backward_num_stages: int = 2

    TILES = ("block_t", "block_c", "backward_block_t", "backward_block_c")
    COUNTS = ("num_warps", "backward_steps", "backward_num_warps", "backward_num_stages")

    def __post_init__(self):
        for name in self.TILES:
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"BlockSizes.{name} must be a power of two, got {value}")
        for name in self.COUNTS:
            if getattr(self, name) < 1:
                raise ValueError(f"BlockSizes.{name} must be >= 1, got {getattr(self, name)}")

    def changed(self) -> dict:
        """The fields that differ from the class defaults (for tables and for pasting)."""
        base = BlockSizes()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(base, f.name)}


def default_block_sizes() -> BlockSizes:
    """GPU defaults: not yet measured (the first H200 run of
    `experiments/benchmarks/short_conv.py --parts sweep` replaces them; NOTES.md). Chosen for
    the registers: the forward keeps one float32 accumulator tile live (64 × 128 over 4 warps:
    64 elements a thread), the backward ~K + 3 tiles (16 × 128 over 4 warps: 16 a thread, ~110
    registers, so 4 programs fit an SM); 8 steps of 16 rows a backward program leave
    [B, T/128, K, C] float32 partial sums of dw (6 MiB at [4, 8192, 1536]), 3072 programs."""
    return BlockSizes()
