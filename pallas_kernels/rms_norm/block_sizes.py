"""Tile sizes and launch parameters of the RMSNorm kernels."""

from __future__ import annotations

import dataclasses

from pallas_kernels.gpu_elementwise import TileChecks

# Elements of one program's tile (rows × the group's channels, padded to a power of two).
FORWARD_TILE = 8192
BACKWARD_TILE = 4096


@dataclasses.dataclass(frozen=True)
class BlockSizes(TileChecks):
    """Tiles (powers of two) and Triton launch parameters of the two kernels. A program always
    holds a whole group of channels (a row's statistics need all of them).

    forward: a program normalises `block_rows` rows × one group; num_warps.
    backward: a program runs `backward_steps` loop steps of `backward_block_rows` rows × one
      group (its dγ partial sums stay in registers over the steps, so fewer programs write
      fewer partials); backward_num_warps, backward_num_stages (the loop's pipelining).
    """

    block_rows: int = 8
    num_warps: int = 8
    backward_block_rows: int = 4
    backward_steps: int = 16
    backward_num_warps: int = 8
    backward_num_stages: int = 2

    TILES = ("block_rows", "backward_block_rows")
    COUNTS = ("num_warps", "backward_steps", "backward_num_warps", "backward_num_stages")


def padded(group_size: int) -> int:
    """The group's width in a tile: the next power of two (Triton's tiles are powers of two;
    the channels past the group are masked)."""
    return 1 << max(group_size - 1, 0).bit_length()


def default_block_sizes(group_size: int, gated: bool = False) -> BlockSizes:
    """8192-element forward tiles and 4096-element backward tiles (bf16 rows of one group; 32
    and 16 float32 values an array a thread over 8 warps), 16 backward steps a program. Groups
    of 512: 16 × 512 forward, 8 × 512 backward; 1024: 8 and 4 rows; 2048: 4 and 2.

    The gated backward of a group of ≥ 1024 channels at 4 warps (session 16, H200, 4 × 8192
    rows, `experiments/benchmarks/rms_norm.py --variants`): Mamba-2's norm (2048 in one
    group, gate inside) fwd+bwd 0.546 → 0.439 ms, 1024 gated 0.276 → 0.234; slower at GDN's
    groups of 512 (0.282 → 0.333) and not better for the plain norm (NOTES.md, "Tiles")."""
    width = padded(group_size)
    return BlockSizes(block_rows=max(1, FORWARD_TILE // width),
                      backward_block_rows=max(1, BACKWARD_TILE // width),
                      backward_num_warps=4 if gated and group_size >= 1024 else 8)
