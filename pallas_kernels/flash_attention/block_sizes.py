"""Tile sizes and launch parameters of the flash-attention kernels, per head dimension."""

from __future__ import annotations

import dataclasses

from pallas_kernels.gpu_elementwise import TileChecks


@dataclasses.dataclass(frozen=True)
class BlockSizes(TileChecks):
    """Tiles (powers of two, >= 8), Triton launch parameters and the backward's form, for
    each of the three kernels separately.

    forward: block_q query rows per program, block_k keys per loop step; num_warps, num_stages.
    dq: block_q_dq query rows per program, block_k_dq keys per step; dq_num_warps, dq_num_stages.
    dk/dv: block_k_dkv keys per program, block_q_dkv query rows per step; dkv_num_warps,
      dkv_num_stages.
    dq_atomic: no dq kernel; the dk/dv kernel adds each block's dq share into a float32
      buffer with atomics (5 matmuls per block pair instead of 7; the order of the additions,
      so dq's last bits, varies from run to run).
    dkv_per_query_head: one dk/dv program per query head rather than per kv head (GQA: the
      group's heads run in parallel, their float32 dk/dv summed afterwards in XLA).
    forward_one_select: the forward's masked blocks select once, on the logits, not again on
      the probabilities (the mask dies before the row maximum: fewer live registers).
    diagonal_causal_only: in every kernel the masked blocks on the causal diagonal that lie
      inside every row's document run and window (past the unmasked interior) test causality
      alone: no segment ids loaded, one compare an element instead of two and an `and`.
    """

    block_q: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    block_q_dq: int = 64
    block_k_dq: int = 64
    dq_num_warps: int = 4
    dq_num_stages: int = 2
    block_q_dkv: int = 64
    block_k_dkv: int = 64
    dkv_num_warps: int = 4
    dkv_num_stages: int = 2
    dq_atomic: bool = False
    dkv_per_query_head: bool = False
    forward_one_select: bool = False
    diagonal_causal_only: bool = False

    TILES = ("block_q", "block_k", "block_q_dq", "block_k_dq", "block_q_dkv", "block_k_dkv")
    COUNTS = ("num_warps", "num_stages", "dq_num_warps", "dq_num_stages", "dkv_num_warps",
              "dkv_num_stages")
    MIN_TILE = 8

    @property
    def time_multiple(self) -> int:
        """The padded length is a multiple of every time tile."""
        return max(getattr(self, name) for name in self.TILES)


def default_block_sizes(head_dim: int) -> BlockSizes:
    """GPU defaults: the fastest variant of each kernel in `experiments/benchmarks/
    flash_attention.py --parts sweep` (jax 0.11.2, kernel version 2, packed documents of median
    1024 tokens at the benchmark's shapes: D64 B16 T2048 H12, D128 B4 T8192 H16, D256 B4 T8192
    H4; NOTES.md): D 64 on an H100 in five rounds (2026-12-05), the others on an H200
    (2026-12-01). The comments give each kernel's ms there, forward / dq / dk,dv, against the
    tiles these replaced. Wider heads take smaller tiles so the float32 accumulators fit the
    registers."""
    # D ≤ 64: 0.305 / 0.309 / 0.443 ms (the tiles before, same run: 0.345 / 0.323 / 0.471)
    if head_dim <= 64:
        return BlockSizes(dq_num_stages=3, block_k_dq=32, block_q_dkv=32, dkv_num_stages=3,
                          forward_one_select=True, diagonal_causal_only=True)
    if head_dim <= 128:  # 1.33 / 1.27 / 1.69 ms (run B: 1.46 / 1.42 / 2.10)
        return BlockSizes(block_k=32, num_stages=4, block_q_dq=128, block_k_dq=32,
                          dq_num_stages=3, block_q_dkv=32)
    # 0.814 / 0.998 / 1.60 ms (run B: 1.30 / 1.72 / 2.55)
    return BlockSizes(block_k=16, block_q_dq=128, block_k_dq=32, dq_num_warps=8,
                      block_q_dkv=32, block_k_dkv=32)
