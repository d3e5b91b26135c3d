"""Tile sizes and launch parameters of the short-convolution kernels."""

from __future__ import annotations

import dataclasses

from pallas_kernels.gpu_elementwise import TileChecks


@dataclasses.dataclass(frozen=True)
class BlockSizes(TileChecks):
    """Tiles (powers of two) and Triton launch parameters of the two kernels.

    forward: a program convolves `block_t` time steps × `block_c` channels of one batch row;
      num_warps.
    backward: a program runs `backward_steps` loop steps of `backward_block_t` time steps ×
      `backward_block_c` channels (its weight-gradient partial sums stay in registers over the
      steps, so fewer programs write fewer partials); backward_num_warps, backward_num_stages
      (the loop's software pipelining).
    backward_stream: the backward in its row-streaming form (`gpu._stream_backward_kernel`,
      NOTES.md): a program walks `backward_steps × backward_block_t` time steps of
      `backward_block_c` channels one step (a `[backward_block_c]` row) at a time,
      `backward_block_t` steps a loop iteration; z and g formed once a step, not K times.
      Off until timed on a GPU; `stream_backward_block_sizes()` has its tiles.
    """

    block_t: int = 16
    block_c: int = 128
    num_warps: int = 2
    backward_block_t: int = 8
    backward_block_c: int = 64
    backward_steps: int = 8
    backward_num_warps: int = 4
    backward_num_stages: int = 2
    backward_stream: bool = False

    TILES = ("block_t", "block_c", "backward_block_t", "backward_block_c")
    COUNTS = ("num_warps", "backward_steps", "backward_num_warps", "backward_num_stages")


def default_block_sizes() -> BlockSizes:
    """GPU defaults from the H200 sweep (session 9, 2026-12-02, `short_conv.py --parts sweep`
    at [4, 8192, 1536], 3 documents a row, one knob at a time from 16 × 128 tiles; NOTES.md).
    Forward: 16 × 128 over 2 warps (0.115 ms; 4 warps 0.143; 64 channels 0.111, within the
    noise, not taken). Backward: 8 × 64 over 4 warps, 8 steps a program (16 × 128: 0.565 ms;
    8 rows 0.468, 64 channels 0.434; the op's fwd+bwd 0.643 → 0.544 ms with both). Its ~2K + 3
    float32 tiles (dw / db summed as tiles over the loop, reduced once at its end) fit in
    registers. Partial sums of dw: [B, T/64, K, C] float32."""
    return BlockSizes()


def stream_backward_block_sizes(base: BlockSizes | None = None) -> BlockSizes:
    """`base` (default: the defaults) with the row-streaming backward: 4 steps a loop
    iteration, 256 channels over 2 warps (4 channels a thread: 172 registers, no spills; 8 a
    thread spill), 64 steps a program. Not timed yet (NOTES.md, "Streaming backward")."""
    return dataclasses.replace(base or BlockSizes(), backward_stream=True, backward_block_t=4,
                               backward_block_c=256, backward_num_warps=2, backward_steps=16)
