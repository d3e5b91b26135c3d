"""Tile sizes and launch parameters of the RMSNorm kernels."""

from __future__ import annotations

import dataclasses

from pallas_kernels.gpu_elementwise import TileChecks

# Elements of one program's tile (rows × the group's channels, padded to a power of two).
FORWARD_TILE = 8192
BACKWARD_TILE = 2048


@dataclasses.dataclass(frozen=True)
class BlockSizes(TileChecks):
    """Tiles (powers of two) and Triton launch parameters of the two kernels. A program always
    holds a whole group of channels (a row's statistics need all of them).

    forward: a program normalises `block_rows` rows × one group; num_warps.
    backward: a program runs `backward_steps` loop steps of `backward_block_rows` rows × one
      group (its dγ partial sums stay in registers over the steps, so fewer programs write
      fewer partials); backward_num_warps, backward_num_stages (Triton's pipelining, which
      leaves these loads alone: the same SASS at 1, 2 and 3 stages, NOTES.md "Session 18").
    backward_prefetch: each step loads the next tile's x, z, dy before its own math, so that
      they are in flight while this tile reduces (otherwise a step's math waits for its own
      loads); the next tile stays in registers in bf16 (1.5 registers an element a thread).
    backward_joint_sums: the backward's two row sums (Σa², Σ dn·a) in one reduction
      (Σ dn·n = r·Σ dn·a) instead of the second waiting for r: half the barriers a step.
    (`default_block_sizes` turns the joint sums on; NOTES.md "Session 18".)
    """

    block_rows: int = 8
    num_warps: int = 8
    backward_block_rows: int = 4
    backward_steps: int = 16
    backward_num_warps: int = 8
    backward_num_stages: int = 2
    backward_prefetch: bool = False
    backward_joint_sums: bool = False

    TILES = ("block_rows", "backward_block_rows")
    COUNTS = ("num_warps", "backward_steps", "backward_num_warps", "backward_num_stages")


def padded(group_size: int) -> int:
    """The group's width in a tile: the next power of two (Triton's tiles are powers of two;
    the channels past the group are masked)."""
    return 1 << max(group_size - 1, 0).bit_length()


def default_block_sizes(group_size: int, gated: bool = False) -> BlockSizes:
    """8192-element forward tiles (bf16 rows of one group; 32 float32 values an array a
    thread over 8 warps); the backward in 2048-element tiles, 32 steps a program, 8 warps,
    its two row sums joint. Groups of 512: 16 × 512 forward, 4 × 512 backward; 1024: 8 and 2
    rows; 2048: 4 and 1. `gated` is kept for the callers (the same tiles either way).

    Session 18 (H200, 4 × 8192 rows, `experiments/benchmarks/rms_norm.py --variants`, call
    s18c): half session 16's backward rows over twice the steps at 8 warps with joint sums
    (80 registers: 3 programs an SM where 255 allowed 2) took fwd+bwd 0.448 → 0.382 ms at
    Mamba-2's norm (2048, gate inside), 0.233 → 0.217 gated 1024, 0.304 → 0.293 GDN's
    groups of 512, plain 0.143 → 0.122 (1024) and 0.246 → 0.219 (1536); with SSD's summed
    scores, mamba2-340m 123,141 → 133,358 tokens/s. (Session 16's gated backward at 4 warps
    for groups ≥ 1024 is replaced; NOTES.md "Tiles", "Session 18".)"""
    del gated
    width = padded(group_size)
    return BlockSizes(block_rows=max(1, FORWARD_TILE // width),
                      backward_block_rows=max(1, BACKWARD_TILE // width),
                      backward_steps=32, backward_joint_sums=True)
