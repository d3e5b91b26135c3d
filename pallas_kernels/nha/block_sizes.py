"""Tile sizes of the NHA kernels and their defaults per backend."""

from __future__ import annotations

import dataclasses

SLOT_PRECISIONS = ("mixed", "split", "float32", "input")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles and launch parameters of the NHA kernels (tiles are powers of two).

    chunk: C, the slot chunk (slot states are kept at multiples of C; the slot kernels own one
      chunk of one head).
    sub_chunk: S, the sub-chunks of the exact path for strongly decaying slots (`chunk_math`).
    block_q / block_k: query rows per program and window keys per loop step of the window
      attention forward and of its dq kernel.
    block_q_dkv / block_k_dkv: query rows per loop step and keys per program of the window
      dk/dv kernel.
    state_group: chunk steps per iteration of the GPU chunk scan (their loads are issued
      together, so their latencies overlap).
    state_block: feature tile of the GPU scan (more tiles, more parallel programs).
    num_warps / num_stages: Triton launch parameters (GPU) of the window attention forward;
      backward_*: of its backward kernels; slot_num_warps / slot_backward_num_warps: of the
      per-chunk slot kernels of the forward / backward pass.
    split_slot_backward: each of the two backward slot kernels runs as two with smaller live
      sets (dA, P, then dq; the keys' half, then the values' half of the slot-input
      gradients), so that fewer warps fit without spills (NOTES.md, v7).
    slot_input_block: the backward slot-input kernels (split or not) loop over the key / value
      features in tiles of this many, a `fori_loop` whose tiles Triton's pipeliner loads with
      `cp.async` (`slot_input_num_stages` deep), and go through the slots in parts of
      `slot_input_slot_block` in between (None: every product over all features and slots at
      once, every tile through registers first: 1.2–1.6 KB of spills a thread; NOTES.md, v8).
    slot_input_slot_block / slot_input_num_stages: of the `slot_input_block` form.
    slot_feature_block: the other per-chunk slot kernels (the forward's logits and readout,
      the backward's dA / P and dq) loop the same way over the features in tiles of this many
      (`slot_feature_num_stages` deep): the sums over the features of their products, or the
      readout's output tile by tile (None: whole-chunk tiles through registers; at D 256 one
      program an SM and up to 1.4 KB of spills a thread: NOTES.md, session 18). Pipelined
      (stages > 1), the scores form's x (q in the logits, dO in dA / P) goes in twice, one
      load for the state product and one for the pairs product: Triton 3.6 gave one load
      feeding both a buffer fewer than the stages, and the next tile's cp.async could
      overwrite it under the pairs' async wgmma (dq, dk, dg 20–50 % wrong at 8 warps on an
      H200; NOTES.md, session 19, "The race"; fixed and checked in session 20).
    slot_precision: how the slot products take their float32 operands
      (`layout.slot_products`): "mixed" (bf16 only in the backward's gradient products dq,
      dk̄, dv̄, TF32 elsewhere: 7 % faster fwd+bwd than "float32" on the H200 at the same
      ≤ 0.4 % gradient error, also at w = 0; NOTES.md, v5), "split" (as "mixed", with hi + lo
      bf16 pairs instead of TF32: NOTES.md, v6), "float32" (TF32 on the GPU) or "input" (bf16
      in the within-chunk products: faster, gradients about 4x less accurate).
    window_keys_transposed: the window dk/dv kernel (GPU) makes its score tiles key-major,
      k·qᵀ `[block_k_dkv, block_q_dkv]`, so that all four of its products have the keys as
      their rows and take those tiles as made: no transposes, and warp-group MMAs throughout
      at block_q_dkv 32, where the query-major form (False) runs q·kᵀ as `mma.sync` and, at
      D 256, spills 424 B a thread (NOTES.md, session 19).
    """

    chunk: int = 64
    sub_chunk: int = 16
    block_q: int = 64
    block_k: int = 64
    block_q_dkv: int = 64
    block_k_dkv: int = 64
    state_group: int = 16
    state_block: int = 8
    num_warps: int = 4
    num_stages: int = 3
    backward_num_warps: int = 4
    backward_num_stages: int = 2
    slot_num_warps: int = 4
    slot_backward_num_warps: int = 8
    split_slot_backward: bool = False
    slot_input_block: int | None = None
    slot_input_slot_block: int = 16
    slot_input_num_stages: int = 2
    slot_feature_block: int | None = None
    slot_feature_num_stages: int = 2
    slot_precision: str = "mixed"
    window_keys_transposed: bool = False

    def __post_init__(self):
        if not isinstance(self.window_keys_transposed, bool):
            raise ValueError("BlockSizes.window_keys_transposed must be a bool, got "
                             f"{self.window_keys_transposed!r}")
        if self.slot_precision not in SLOT_PRECISIONS:
            raise ValueError(f"BlockSizes.slot_precision must be one of {SLOT_PRECISIONS}, "
                             f"got {self.slot_precision!r}")
        for name in ("chunk", "sub_chunk", "block_q", "block_k", "block_q_dkv", "block_k_dkv",
                     "state_block", "state_group", "slot_input_block", "slot_input_slot_block",
                     "slot_feature_block"):
            value = getattr(self, name)
            if value is not None and (value < 1 or value & (value - 1)):
                raise ValueError(f"BlockSizes.{name} must be a power of two, got {value}")
        for name in ("num_warps", "num_stages", "backward_num_warps", "backward_num_stages",
                     "slot_num_warps", "slot_backward_num_warps", "slot_input_num_stages",
                     "slot_feature_num_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"BlockSizes.{name} must be >= 1, got {getattr(self, name)}")
        if self.sub_chunk > self.chunk:
            raise ValueError(f"BlockSizes.sub_chunk ({self.sub_chunk}) must be <= chunk "
                             f"({self.chunk})")

    @property
    def time_multiple(self) -> int:
        """The padded length must be a multiple of every time tile."""
        return max(self.chunk, self.block_q, self.block_k, self.block_q_dkv, self.block_k_dkv)


def default_block_sizes(backend: str, head_dim: int) -> BlockSizes:
    """Defaults measured on an H200 at head dim 128 (GPU; see NOTES.md); TPU tiles fill the
    128-lane axis. Head dim 256: twice the warps (a [64, 256] float32 accumulator is 128
    registers a thread at 4 warps) and key / query tiles of 32 rows in the pipelined window
    loops, so that their stages fit the 227 KB of shared memory a block may use (forward: q
    32 KB + 3 stages of k, v at 32 KB; dq and dk/dv: 64 KB + 2 stages of 32 KB); the backward
    slot kernels split at 4 warps, the slot-input ones over feature tiles of 64 (NOTES.md v8:
    nha-340m's layer, B4 T8192 H4 w32 with packed documents, fwd+bwd 4.27 ms unsplit at 8
    warps, 3.95 split, 3.71 with the tiles; session 17, results/s17b); the other slot kernels
    over feature tiles of 64 too, at 4 warps (NOTES.md session 18: 2 programs an SM, not 1;
    the same layer 3.69 → 3.36 ms at 8 warps, 3.14 at 4; session 19, results/s19a); the
    window dk/dv kernel's scores key-major, its and dq's loads 3 stages deep, the forward and
    dq over 128 query rows (NOTES.md session 19: 3.17 → 3.02 ms, results/s19e)."""
    if backend == "tpu":
        return BlockSizes(chunk=128, sub_chunk=16, block_q=128, block_k=128, block_q_dkv=128,
                          block_k_dkv=128, state_block=128)
    if head_dim > 128:
        return BlockSizes(block_q=128, block_k=32, block_q_dkv=32, num_warps=8,
                          backward_num_warps=8, backward_num_stages=3,
                          window_keys_transposed=True, split_slot_backward=True,
                          slot_backward_num_warps=4, slot_input_block=64, slot_feature_block=64)
    # The backward slot kernels split in two each at 4 warps: fwd+bwd 7.02 ms against 7.64
    # unsplit at 8 warps (B4 T8192 H16 D128 w512, NOTES.md v7; results/s6a). From D 128 the
    # other slot kernels over feature tiles of 64 (with packed documents, the same shape's
    # fwd+bwd kernels 7.51 → 7.32 ms; session 19, results/s19c; at D 64 a tile is the whole)
    # and the window dk/dv kernel key-major (7.39 → 7.24; 3 stages and 128 query rows, D 256's,
    # lose here: 7.63 and 9.62; results/s19g). D 64 is not timed.
    wide = head_dim >= 128
    return BlockSizes(split_slot_backward=True, slot_backward_num_warps=4,
                      slot_feature_block=64 if wide else None, window_keys_transposed=wide)
