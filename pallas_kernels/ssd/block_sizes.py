"""Tile sizes and Triton launch parameters of the SSD kernels, per head dimensions."""

from __future__ import annotations

import dataclasses

_POWERS = ("chunk", "block_p", "backward_block_p", "grads_block_p")
_COUNTS = ("num_warps", "num_stages", "backward_num_warps", "backward_num_stages",
           "grads_num_warps", "grads_num_stages")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles (powers of two) and launch parameters of the three kernels (`gpu.py`).

    chunk: L, the time steps of one chunk (states are kept at chunk boundaries only).
    block_p: rows of the state tile `[block_p, N]` each program of the forward carries in
      registers over the chunk loop (more programs, more redundant chunk scores C·Bᵀ).
    backward_block_p: the same for the reverse pass over chunks (state gradients).
    grads_block_p: feature tile of the per-chunk gradient kernel's loops over P (bounds the
      `[block, N]` state operands it holds at once: 64 keeps that kernel's shared memory well
      inside the H200's at N = 128; the sweep also tries 128).
    num_warps / num_stages: the forward; backward_*: the reverse pass; grads_*: the per-chunk
      gradient kernel.
    """

    chunk: int = 64
    block_p: int = 64
    backward_block_p: int = 64
    grads_block_p: int = 64
    num_warps: int = 4
    num_stages: int = 2
    backward_num_warps: int = 4
    backward_num_stages: int = 2
    grads_num_warps: int = 8
    grads_num_stages: int = 1

    def __post_init__(self):
        for name in _POWERS:
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"BlockSizes.{name} must be a power of two, got {value}")
        for name in _COUNTS:
            if getattr(self, name) < 1:
                raise ValueError(f"BlockSizes.{name} must be >= 1, got {getattr(self, name)}")

    def for_dims(self, head_dim: int) -> BlockSizes:
        """The feature tiles clipped to the head dimension P (a tile never exceeds P)."""
        return dataclasses.replace(self, block_p=min(self.block_p, head_dim),
                                   backward_block_p=min(self.backward_block_p, head_dim),
                                   grads_block_p=min(self.grads_block_p, head_dim))


def default_block_sizes(head_dim: int, state_dim: int) -> BlockSizes:
    """GPU defaults (NOTES.md): P = N = 128 is the tuned case; a head or state dimension of 256
    takes chunks of 32 and narrower feature tiles, so the float32 tiles stay in registers."""
    if max(head_dim, state_dim) <= 128:
        return BlockSizes().for_dims(head_dim)
    return BlockSizes(chunk=32, block_p=32, backward_block_p=32, grads_block_p=64).for_dims(
        head_dim)
