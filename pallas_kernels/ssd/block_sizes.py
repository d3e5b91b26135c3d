"""Tile sizes and launch parameters of the SSD kernels, per backend and head dimensions, and the
static part of one call."""

from __future__ import annotations

import dataclasses

_POWERS = ("chunk", "block_p", "backward_block_p", "grads_block_p")
_COUNTS = ("num_warps", "num_stages", "backward_num_warps", "backward_num_stages",
           "grads_num_warps", "grads_num_stages", "local_num_warps", "local_num_stages")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles (powers of two) and launch parameters of the three kernels (`gpu.py`).

    chunk: L, the time steps of one chunk (states are kept at chunk boundaries only).
    block_p: rows of the state tile `[block_p, N]` each program of the forward carries in
      registers over the chunk loop (more programs, more redundant chunk scores C·Bᵀ).
    backward_block_p: the same for the reverse pass over chunks (state gradients).
    grads_block_p: feature tile of the per-chunk gradient kernel's loop over P. At P = 128 the
      whole of P (128): 64 splits each head's products into pieces whose partial sums ptxas
      serializes against the tensor cores ("wgmma serialized", its warning C7514).
    num_warps / num_stages: the forward; backward_*: the reverse pass; grads_*: the per-chunk
      gradient kernel.
    split_forward: the forward's within-chunk outputs from a kernel of their own
      (`gpu.chunk_outputs`, every chunk in parallel, launched with local_num_warps /
      local_num_stages), so that the loop over chunks only carries the state (not yet timed:
      `linear_ops` times it beside the default, NOTES.md).
    state_pass: the forward as fla's two kernels: `gpu.chunk_states`, a serial loop that only
      carries the state tile and stores it (input dtype) entering every chunk, then
      `gpu.chunk_outputs` reading those states, every (batch, group, chunk) in parallel (the
      within-chunk part and the entering state's readout; local_num_warps / local_num_stages).
      The VJP's forward reuses the stored states as its residual.
    state_block_n: with `state_pass`, the state columns (of N) each program of `chunk_states`
      carries: None, all of N; 64 at N = 128 gives fla's `[64, 64]` tiles and twice the
      programs (B·H·P/block_p·N/64).
    cumulative_decay: the forward kernels read each chunk's inclusive cumulative log decay,
      formed by XLA before the call (as fla's `chunk_local_cumsum`), instead of scanning dt·A
      inside the serial loop.
    state_vectors_in_step: with `state_pass`, each step of `chunk_states` reads its own chunk's
      per-step vectors (dt, the log decays, doc), which Triton's pipeliner then loads with
      `cp.async` beside the x and B tiles, `num_stages - 1` steps ahead; off, they are read a
      step ahead through registers, whose loop-carried copy ptxas makes at the step's end, so
      each step waits for that load's full latency (NOTES.md round 7; on for bf16 by default
      since session 15, where it gains at 4 stages).
    decays_first: the fused forward (`state_pass` and `split_forward` off) forms each chunk's
      `[L, L]` pair decays before its first read of the chunk's tiles instead of after C·Bᵀ:
      the same values; ptxas then issues their exponentials while C·Bᵀ runs on the tensor
      cores (NOTES.md round 6; not yet timed).
    grads_summed_scores: the per-chunk gradient kernel sums its heads' score gradients
      `[L, L]` in the head loop and multiplies the sum by B and C once after it, instead of
      each head's (a third of its products). XLA makes the chunk's C·Bᵀ (made in the kernel it
      takes Triton's chained-product layout, L rows repeated on both warp groups) and the log
      decays' within-chunk sums (the cumulative log decay, the reverse cumulative sum of its
      gradient: CTA-wide scans in the loop). At mamba2-340m's P 64 its head step has 24 HGMMA
      instead of 36 and 32 barriers instead of 54 (ptxas, NOTES.md session 18); the bf16
      default at P ≤ 64 since (mamba2-340m +7–8 % with the norms' session-18 tiles, call s18c).
    backward_block_n: the state columns (of N) each program of the reverse pass
      (`gpu.state_grads`) carries: None, all of N; 64 at N = 128 gives `chunk_states`' `[64, 64]`
      tiles and twice its programs (B·H·P/backward_block_p·N/64), each step's C tile and state
      loads halved, dy read once per column tile. At mamba2-340m's H32 P64 the default grid is
      128 programs, one a SM on 132 SMs, at 255 registers and 104 B of spills; at 64 it is 256
      programs, two a SM, with no spills (ptxas, NOTES.md session 19; not yet timed).
    segments: S, a power of two: each row is split into S equal segments (of whole chunks)
      that the kernels run as separate rows, `[B·S, T/S]`: S times the programs and chains S
      times shorter, combined exactly in XLA (`segments.py`, NOTES.md round 3). None
      (default): `segments.choose_segments`, about 1 program per SM with ≥ 8 chunks per
      segment on a GPU, 1 in interpret mode.

    Defaults (P, N ≤ 128) from the first H200 sweep (2026-12-01, jax 0.11.2, B4 T8192 H16
    P = N = 128 bf16, `linear_ops --parts sweep`), the fastest of each kernel: forward (chunk
    64, block_p 64, 4 warps, 2 stages) 0.609 ms; reverse pass (64, 4 warps, 2 stages) 0.465 ms;
    per-chunk gradients: block 128 with 8 warps (1.62 ms at 2 stages, 1.81 at 1, against 2.14
    at the tiles before: block 64, 1 stage). That sweep timed round 1's gradient kernel; the
    current one (NOTES.md, round 2) keeps block 128 and 8 warps, and 1 stage: at 2 stages Triton
    3.6 gives it 229,888 bytes of shared memory, 2.5 KB under the H200's 227 KB per block (XLA's
    own Triton may allocate a little differently, and a kernel over the limit does not launch);
    `linear_ops` times the 2-stage variant beside it. The plain forward and the forward inside
    the VJP share the forward's fields: that sweep's best forward *is* (64, 64, 4, 2), so the
    run's two whole-op forward rows (0.668 vs 0.782 ms) ran the same kernels (NOTES.md).
    """

    chunk: int = 64
    block_p: int = 64
    backward_block_p: int = 64
    grads_block_p: int = 128
    num_warps: int = 4
    num_stages: int = 2
    backward_num_warps: int = 4
    backward_num_stages: int = 2
    grads_num_warps: int = 8
    grads_num_stages: int = 1
    split_forward: bool = False
    local_num_warps: int = 4
    local_num_stages: int = 2
    state_pass: bool = False
    state_block_n: int | None = None
    cumulative_decay: bool = False
    decays_first: bool = False
    state_vectors_in_step: bool = False
    grads_summed_scores: bool = False
    backward_block_n: int | None = None
    segments: int | None = None

    def __post_init__(self):
        S = self.segments
        if S is not None and (S < 1 or S & (S - 1)):
            raise ValueError(f"BlockSizes.segments must be None or a power of two, got "
                             f"{self.segments}")
        if self.state_pass and self.split_forward:
            raise ValueError("BlockSizes.state_pass and split_forward are two forms of the "
                             "split forward: choose one")
        n = self.state_block_n
        if n is not None and (n < 1 or n & (n - 1)):
            raise ValueError(f"BlockSizes.state_block_n must be None or a power of two, got {n}")
        n = self.backward_block_n
        if n is not None and (n < 1 or n & (n - 1)):
            raise ValueError(f"BlockSizes.backward_block_n must be None or a power of two, "
                             f"got {n}")
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


@dataclasses.dataclass(frozen=True)
class Static:
    """The static part of one call (hashable: a `custom_vjp` nondiff argument).

    group: heads per B/C group (H/G); documents: doc is passed (packed documents).
    """

    blocks: BlockSizes
    group: int
    documents: bool
    interpret: bool


def default_block_sizes(head_dim: int, state_dim: int, backend: str = "gpu", *,
                        itemsize: int = 2) -> BlockSizes:
    """Defaults of the backend's kernels, for inputs of `itemsize` bytes (bf16: 2).

    TPU (`tpu.py`, not timed: no TPU here): chunks of 128, because the per-step vectors'
    blocks `[L]` sit on the 128-lane axis (64 would be half a lane tile, which Mosaic refuses
    for a block that is not the whole axis) and C·Bᵀ `[L, L]` then fills the 128 × 128 MXU;
    the whole of P in one state tile (at most 256 × 256 float32, 256 KB of VMEM), so C·Bᵀ is
    formed once per head and chunk. The warp / stage counts are unused there.

    GPU (NOTES.md): P = N = 128 is the tuned case; a head or state dimension of 256 takes
    chunks of 32 and narrower feature tiles, so the float32 tiles stay in registers (not timed
    yet: chosen by ptxas' spill counts, where one pipeline stage spills least in the per-chunk
    gradient kernel, as at 128)."""
    if backend == "tpu":
        return BlockSizes(chunk=128, block_p=head_dim, backward_block_p=head_dim,
                          grads_block_p=head_dim)
    if max(head_dim, state_dim) <= 128:
        # The state pass (fla's two kernels, state tiles of 64 columns): fwd+bwd 1.99 → 1.71
        # ms against the fused kernel, H200 B4 T8192 H16 P = N = 128 bf16 (NOTES.md round 5);
        # with both its kernels at 3 stages (round 6) also the faster forward: 0.395 against
        # the fused 0.419 ms, fwd+bwd 1.66 → 1.63. Round 7 (session 15): `chunk_states` reading
        # each step's dt / decays beside its tiles, at 4 stages: forward 0.396 → 0.346 ms,
        # fwd+bwd 1.65 → 1.61 (at 3 stages no change). Session 16: at P 64 (Mamba-2's heads)
        # the per-chunk gradients' head loop at 3 stages, its loads pipelined (at P 128 two
        # stages already ask 229,888 B of 227 KB): mamba2-340m's H32 P64, `chunk_grads` 1.28
        # → 1.07 ms a call (2 stages 1.20), fwd+bwd 1.82 → 1.61. Float32 inputs (twice the
        # shared memory a stage, not timed) keep 2 stages (1 in `chunk_grads`). Session 18:
        # at P 64 `chunk_grads` sums its heads' score gradients (5 products a head, not 7;
        # GPU check PASS): with the norms' session-18 tiles, mamba2-340m 123,141 → 133,358
        # and 131,775 tokens/s (call s18c; the norms alone ≈ 1 % of it). Session 19: at P 128
        # the summed form's smaller live set lets `chunk_grads` pipeline 2 stages (3 ask 328 KB):
        # B4 T8192 H16 P = N = 128 with documents, `chunk_grads` 0.972 → 0.542 ms a call, the
        # op's fwd+bwd kernels 1.519 → 1.105 ms (results/s19a; GPU check PASS).
        stages = (dict(num_stages=4, local_num_stages=3, state_vectors_in_step=True,
                       grads_num_stages=3 if head_dim <= 64 else 2, grads_summed_scores=True)
                  if itemsize <= 2 else {})
        return BlockSizes(state_pass=True, state_block_n=64, cumulative_decay=True,
                          **stages).for_dims(head_dim)
    return BlockSizes(chunk=32, block_p=32, backward_block_p=32, grads_block_p=64).for_dims(
        head_dim)
