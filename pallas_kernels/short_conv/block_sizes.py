"""Tile sizes and launch parameters of the short-convolution kernels."""

from __future__ import annotations

import dataclasses

from pallas_kernels.gpu_elementwise import TileChecks


@dataclasses.dataclass(frozen=True)
class BlockSizes(TileChecks):
    """Tiles (powers of two) and Triton launch parameters of the two kernels.

    forward: a program convolves `block_t` time steps × `block_c` channels of one batch row;
      num_warps.
    backward: a program walks `backward_steps × backward_block_t` time steps of
      `backward_block_c` channels one step (a `[backward_block_c]` row) at a time,
      `backward_block_t` steps a loop iteration (read an iteration ahead); its weight-gradient
      partial sums stay in registers over the run, so fewer programs write fewer partials;
      backward_num_warps, backward_num_stages (the loop's software pipelining).
    """

    block_t: int = 16
    block_c: int = 128
    num_warps: int = 2
    backward_block_t: int = 4
    backward_block_c: int = 128
    backward_steps: int = 16
    backward_num_warps: int = 1
    backward_num_stages: int = 2

    TILES = ("block_t", "block_c", "backward_block_t", "backward_block_c")
    COUNTS = ("num_warps", "backward_steps", "backward_num_warps", "backward_num_stages")


def default_block_sizes() -> BlockSizes:
    """GPU defaults from the H200. Forward (session 9's sweep at [4, 8192, 1536], 3 documents a
    row, one knob at a time from 16 × 128 tiles; NOTES.md): 16 × 128 over 2 warps (0.115 ms;
    4 warps 0.143; 64 channels 0.111, within the noise, not taken). Backward (session 15,
    `short_conv.py --parts variants` at [4, 8192, C], 1 and 3 documents a row; NOTES.md
    "Streaming backward"): rows streamed 4 steps a loop iteration, 64 steps a program, 128
    channels on one warp (4 a thread): 0.086 / 0.14–0.15 ms at C 768 / 1536 against the tile
    form's 0.21–0.25 / 0.38–0.43; 256 channels on 2 warps within 5 % (fwd+bwd summed over the
    four shapes 0.733 vs 0.768 ms). Partial sums of dw: [B, T/64, K, C] float32."""
    return BlockSizes()
