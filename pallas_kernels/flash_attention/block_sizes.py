"""Tile sizes and launch parameters of the flash-attention kernels, per head dimension."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles (powers of two, >= 8) and Triton launch parameters.

    block_q / block_k: query rows per program and keys per loop step of the forward and of the
      dq kernel. block_q_dkv / block_k_dkv: query rows per loop step and keys per program of
      the dk/dv kernel. num_warps / num_stages: forward; backward_*: both backward kernels.
    """

    block_q: int = 128
    block_k: int = 64
    block_q_dkv: int = 64
    block_k_dkv: int = 64
    num_warps: int = 4
    num_stages: int = 3
    backward_num_warps: int = 4
    backward_num_stages: int = 2

    def __post_init__(self):
        for name in ("block_q", "block_k", "block_q_dkv", "block_k_dkv"):
            value = getattr(self, name)
            if value < 8 or value & (value - 1):
                raise ValueError(f"BlockSizes.{name} must be a power of two >= 8, got {value}")
        for name in ("num_warps", "num_stages", "backward_num_warps", "backward_num_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"BlockSizes.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def time_multiple(self) -> int:
        """The padded length is a multiple of every time tile."""
        return max(self.block_q, self.block_k, self.block_q_dkv, self.block_k_dkv)


def default_block_sizes(head_dim: int) -> BlockSizes:
    """GPU defaults, the fastest of the variants measured on the H200 (NOTES.md); wider heads
    take smaller tiles so the float32 accumulators fit the registers."""
    if head_dim <= 64:
        return BlockSizes(block_q=64, block_k=64, num_warps=4, backward_num_warps=4)
    if head_dim <= 128:
        return BlockSizes(block_q=128, block_k=64, block_q_dkv=32, block_k_dkv=128, num_warps=8,
                          backward_num_warps=8)
    return BlockSizes(block_q=64, block_k=32, block_q_dkv=32, block_k_dkv=32, num_warps=8,
                      num_stages=2, backward_num_warps=8)
