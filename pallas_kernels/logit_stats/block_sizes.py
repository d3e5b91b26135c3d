"""Tile sizes and launch parameters of the logit-statistics kernel."""

from __future__ import annotations

import dataclasses

from pallas_kernels.gpu_elementwise import TileChecks


@dataclasses.dataclass(frozen=True)
class BlockSizes(TileChecks):
    """A program reduces `block_rows` rows, `block_vocab` columns (lanes) a loop step (powers
    of two; each lane carries six float32 or int32 statistics in registers); `prefetch`: each
    step loads the next tile before updating with its own, so that its loads are in flight
    meanwhile (Triton pipelines only loads that feed products)."""

    block_rows: int = 1
    block_vocab: int = 512  # the fastest of the tiles timed on the H200 (NOTES.md)
    num_warps: int = 4
    prefetch: bool = False

    TILES = ("block_rows", "block_vocab")
    COUNTS = ("num_warps",)
