"""Tiles and Triton launch parameters of the gated delta rule kernels, and their defaults."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles (powers of two) and launch parameters.

    chunk: C, the steps of one chunk (one program of the parallel kernels; one iteration of the
      sequential ones). sub_chunk: the diagonal blocks of the C×C triangular inverse (inverted by
      forward substitution, all at once), then merged pairwise up to C.
    value_block: the V tile of the two sequential kernels (one program per batch, head and V
      tile; the state update is separable over the columns of V).
    gradient_key_block / gradient_value_block: the K and V tiles that `chunk_gradients` loops
      over (its float32 accumulators are [C, key tile] and [C, C]).
    split_gradients: the per-chunk gradients as two kernels (`gradients.py`): dv and the pair
      terms' [C, C] gradients per chunk, then dq and dk per (chunk, K tile), each with a small
      live set, instead of one kernel doing both (NOTES.md, Round 3).
    inverse_by_block: `chunk_prepare` inverts the diagonal sub-chunk blocks of T viewed as
      `[C / sub_chunk, sub_chunk, sub_chunk]` (sums within a warp, no Aᵀ) instead of on the
      whole C×C tile (a shared-memory round trip and two barriers a substitution step)
      (NOTES.md, Round 4).
    split_outputs: the forward as two passes, as fla does it: the sequential kernel carries
      only the state (U = U₀ − W S, S's update) and stores U and the state entering each chunk
      (input dtype, as the training forward stores them for the backward anyway), then a
      parallel kernel per (batch, head, chunk) makes o = Q̃ S₀ + P U (NOTES.md, Round 5).
    forward_value_block / forward_state_num_warps / forward_state_num_stages: the forward
      sequential kernel's own V tile and launch (None: value_block, state_num_warps,
      state_num_stages, which the reverse state-gradient pass keeps), e.g. fla's V tile of 64
      in the forward state pass, half the programs of 32, each reading W and K once for twice
      the columns (NOTES.md, Round 10).
    outputs_value_block: the V tile of the split forward's output kernel (None: the whole V),
      a grid axis of its own: at K 256 its whole-V program holds the `[K, V]` state tile, 200
      KB of shared memory and spills (`../COMPILED.md`, suggestion 6).
    forward_state_key_block: the split forward's state pass carries the state as row blocks
      of this many keys (fla's b_h1..b_h4), each block's bf16 copy stored as it is made,
      before W S; W's and K's column tiles loaded per block (None, or ≥ K: one [K, V tile]
      state). ptxas (sm_90a, CPU; NOTES.md Round 12) at K 256, V 64, 4 warps: 255 registers
      and 248 B of spills as one tile, 252 and none in blocks of 64.
    reverse_state_key_block: the reverse state-gradient pass carries dS as row blocks of this
      many keys, the same way: each block stored first, K̃ dS formed as Σᵢ K̃[:, block i] dSᵢ,
      each block updated with q's and W's column tiles (None, or ≥ K: one [K, V tile] dS).
      ptxas (NOTES.md Round 15) at K 256, V 64, 1 stage, 8 warps: one tile 248 registers and
      no spills, blocks of 64 264 B of spills (a [64, V tile] product over 8 warps takes two
      MMA layouts: 83 barriers a step), blocks of 128 64 B outside the loop; at 4 warps
      blocks of 64 spill 208 B against one tile's 568.
    outputs_key_block: the split forward's output kernel makes Q̃ S₀ in a loop over key blocks
      of this many columns of q and rows of the state (fla's BK), so that Triton's pipeliner
      loads them with `cp.async` `outputs_num_stages` deep instead of every tile through
      registers before the first product (None, or ≥ K: one product).
    pipelined_key_gradients: `chunk_key_gradients` (and the fused `chunk_gradients`' key
      part) make their products over V tiles in a loop, whose loads Triton pipelines with
      `cp.async` at `gradient_num_stages` ≥ 2, instead of unrolled with every load through
      registers (ptxas, K 256, 4 warps: 255 registers and 248 B of spills → 24 B at 2 stages;
      NOTES.md Round 17).
    pipelined_pair_gradients: `chunk_pair_gradients` (and the fused `chunk_gradients`' pair
      part) make dv, dA and dP over V tiles in a loop, whose u, dU and dO Triton pipelines with
      `cp.async` at `gradient_num_stages` ≥ 2, instead of unrolled with every tile through
      registers (ptxas, K 256 V 512, 4 warps, 3 stages: 468 B of spills → none, 255
      registers, shared 64 → 88 KB, still 2 programs an SM; NOTES.md Round 21).
    tf32_merges: `chunk_prepare` merges the inverse's diagonal blocks (T ← T − T (A_b T), two
      levels at C 64, sub-chunks 16) by one float32 product each, TF32 on the GPU's tensor
      cores (as fla's solve does), instead of three bf16 products of hi/lo splits
      (`chunk_math.split_products`; exact HIGHEST products for float32 inputs): T to ≈ 2⁻¹¹
      relative instead of ≈ 2⁻¹⁶, still below the bf16 rounding of the stored W and U₀.
      ptxas (K = V = 128, 4 warps; NOTES.md Round 18): 3,448 → 2,899 SASS instructions,
      76 → 60 HGMMA, 166 → 164 registers. A forward option: NOTES' Precision found T's
      rounding in U₀ amplified into dg by the backward. Default for a forward alone at K 128
      (session 15, Round 18 measured).
    prepare_loads_first: `chunk_prepare` reads all its inputs (q, k, g, β, the starts and
      v's first value slice) at its top, in one batch, instead of each where first used: the
      compiler does not move a load above a store to another output (they could alias), so
      β (after P's store) and v (after W's) were global round trips on the program's chain,
      five in a row (two left with the option). ptxas (K = V = 128, 4 warps, the forward's
      TF32 merges; NOTES.md session 19): the same 2,912 SASS instructions and 3 programs an
      SM, 164 → 167 registers, 49,152 → 65,536 B of shared memory (v waits there), 32 → 28
      barriers; with documents 166 registers both. A forward option: saving T (training,
      where T is then stored as soon as made) it costs 2 registers at the exact merges (2
      programs an SM either way) and a program an SM with the TF32 merges (167 → 172
      registers); at K 256 255 registers and 68 B of spills. Default for a forward alone at
      K 128 (session 20, kernel time on the H200: `chunk_prepare` 403 → 385 µs, the forward
      0.848 → 0.817 ms; in training 357 → 424 µs, at K 256 even).
    store_state_first: the sequential forward stores the state entering a chunk before its
      W S product rather than after, while the chunk's loads are in flight, as fla's does.
    reverse_small_scales: the reverse state-gradient pass applies the row scales (the
      queries' e^Γ·scale, the keys' e^{Γ_C − Γ}) to dO and to K dS, the `[C, V tile]` side,
      rather than to q and k, the `[C, K]` side, as the forward's split state pass does: a
      smaller live set. ptxas (sm_90a, CPU, `../COMPILED.md`): at K 256 and 8 warps the pass
      spills 472 B a thread as it is, none with this and 1 stage (228 registers, 143 KB, loop
      715 instructions against 1,398), but at 2 stages it asks 250 KB of shared memory, over
      the H200's limit: pair it with `state_num_stages=1` (and `forward_state_num_stages=2`).
    reverse_in_flight: the reverse state-gradient pass reads each chunk's tiles where first
      used, after dS's stores, and q through a negation, so that at `state_num_stages=2`
      Triton's pipeliner stages k, P, dO and W a step ahead in shared memory (`cp.async`) and
      brings q through registers a step ahead; its one wait then sits after the stores instead
      of two register-path loads' waits at the step's top. Needs `reverse_small_scales`. ptxas
      (K 256, V 64, 8 warps, 2 stages; NOTES.md Round 22): in key blocks of 128, 189 KB of
      shared memory and 180 B of loop-invariant spills; one tile 222 KB and 388 B.
    *_num_warps / *_num_stages: Triton launch parameters of `chunk_prepare` (prepare), of the
      sequential kernels (state), of the split forward's output kernel (outputs) and of the
      per-chunk gradient kernels (gradient).
    """

    chunk: int = 64
    sub_chunk: int = 16
    value_block: int = 64
    gradient_key_block: int = 64
    gradient_value_block: int = 64
    split_gradients: bool = False  # the default_block_sizes() take the split (measured faster)
    forward_value_block: int | None = None
    forward_state_num_warps: int | None = None
    forward_state_num_stages: int | None = None
    outputs_value_block: int | None = None
    forward_state_key_block: int | None = None
    reverse_state_key_block: int | None = None
    outputs_key_block: int | None = None
    pipelined_key_gradients: bool = False
    pipelined_pair_gradients: bool = False
    store_state_first: bool = False
    tf32_merges: bool = False
    prepare_loads_first: bool = False
    reverse_small_scales: bool = False
    reverse_in_flight: bool = False
    inverse_by_block: bool = False
    split_outputs: bool = False
    prepare_num_warps: int = 4
    prepare_num_stages: int = 1
    state_num_warps: int = 4
    state_num_stages: int = 2
    outputs_num_warps: int = 4
    outputs_num_stages: int = 1
    gradient_num_warps: int = 8
    gradient_num_stages: int = 1

    def __post_init__(self):
        for name in ("chunk", "sub_chunk", "value_block", "gradient_key_block",
                     "gradient_value_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2 or value & (value - 1):
                raise ValueError(f"BlockSizes.{name} must be a power of two >= 2, got {value!r}")
        for name in ("forward_value_block", "outputs_value_block", "forward_state_key_block",
                     "reverse_state_key_block", "outputs_key_block"):
            tile = getattr(self, name)
            if tile is not None and (not isinstance(tile, int) or tile < 2 or tile & (tile - 1)):
                raise ValueError(f"BlockSizes.{name} must be None or a power of two >= 2, "
                                 f"got {tile!r}")
        for name in ("forward_state_num_warps", "forward_state_num_stages"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"BlockSizes.{name} must be None or >= 1, got {value}")
        if self.forward_state_key_block is not None and not self.split_outputs:
            raise ValueError("BlockSizes.forward_state_key_block needs split_outputs=True (the "
                             "state pass that carries only the state)")
        if self.reverse_in_flight and not self.reverse_small_scales:
            raise ValueError("BlockSizes.reverse_in_flight needs reverse_small_scales=True (k and "
                             "q as loaded, the row scales on the [C, V tile] side)")
        if not isinstance(self.prepare_loads_first, bool):
            raise ValueError(f"BlockSizes.prepare_loads_first must be True or False, got "
                             f"{self.prepare_loads_first!r}")
        if self.sub_chunk > self.chunk:
            raise ValueError(f"BlockSizes.sub_chunk ({self.sub_chunk}) must be <= chunk "
                             f"({self.chunk})")
        for name in ("prepare_num_warps", "prepare_num_stages", "state_num_warps",
                     "state_num_stages", "outputs_num_warps", "outputs_num_stages",
                     "gradient_num_warps", "gradient_num_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"BlockSizes.{name} must be >= 1, got {getattr(self, name)}")


# Below this many programs of 64 value columns (batch × heads × V / 64) the two sequential
# state passes leave most of a GPU's 132 SMs idle; above K 128 they then run in V tiles of 32
# (`default_block_sizes`, NOTES.md "Session 35").
FEW_PROGRAMS = 64
# Below K 128 the state tile is small and narrow V tiles cost little: fewer than this many
# programs of 64 columns train and run a forward alone in V tiles of 16; a forward alone at up
# to `FEW_PROGRAMS` runs in 32 (NOTES.md "Session 36", "Session 37").
FEW_PROGRAMS_BELOW_K128 = 32


def default_block_sizes(key_dim: int, value_dim: int, *, training: bool = True,
                        itemsize: int = 2, sequences: int | None = None) -> BlockSizes:
    """GPU defaults (NOTES.md) for the training forward and backward (`training`) or for a
    forward that is not differentiated, of inputs of `itemsize` bytes (bf16: 2), over
    `sequences` recurrences (batch × heads of the call; None: many).

    Both invert T block by block (forward 1.16 → 0.99 ms, fwd+bwd 3.90 → 3.59, H200 B4 T8192
    H16 K = V = 128 bf16, NOTES.md Round 4). The outputs are split from the sequential pass
    (Round 5), whose programs then carry only the state; the reverse state-gradient pass runs
    in V tiles of 32: fwd+bwd 3.07 ms against 3.59 fused. At K = 256 (gdn-340m: B4 T8192 H3,
    V 512 as two slices) the fused state [K, V tile] is too large and the split pass wins both
    ways: forward 1.52 ms against 1.98 fused V32, fwd+bwd 6.10 against 8.15 split V16 (Round
    6); its reverse pass at 8 warps: fwd+bwd 4.81 against 5.17 at 4. A rule narrowing tiles
    to V16 at gdn-340m's 12 sequences cost 2 ms of 8 (session 7); session 35 measured where V
    32 pays above K 128 (`FEW_PROGRAMS`): gdn-340m at B 1 × T 32768, 24 programs of 64
    columns, 110,441 → 119,478 tokens/s training with both state passes at V 32, and a
    forward alone (prefill) of its mixer 2.37 → 1.89 ms (H100); session 36, below K 128:
    training at fewer than `FEW_PROGRAMS_BELOW_K128` programs runs both passes in V tiles of
    16 (gdn-130m at B 1 × T 32768, 12 heads: +5.4 % tokens/s), a forward alone too, and at up
    to `FEW_PROGRAMS` in 32 (session 37: 12 heads B 1 × 32768 1.43 → 1.18 ms, B 4 × 8192
    0.689 → 0.655); at K 128 a forward alone at up to `FEW_PROGRAMS` runs its state pass
    at V 32 (16 heads at B 1 × T 32768: 1.81 → 1.43 ms).

    Round 10 (session 12, same run as fla's forward): the forward state pass has its own
    launch and the reverse pass its row scales on the small side at one stage.
    K = 128: the forward state pass in V tiles of 64 at 4 stages (fla's pick), which makes
    the split forward faster than the fused one it replaces for a forward alone: forward
    0.991 → 0.900 ms (fla 0.89), fwd+bwd 3.03 → 2.87. K > 128: the forward state pass at
    4 warps and 1 stage in V tiles of 32: forward 1.49 → 1.44, fwd+bwd 5.01 → 4.35; then
    the reverse pass in V tiles of 64 (8 warps): fwd+bwd 4.39 → 3.90 (call d); then (Round
    12, call f) the forward state pass as row blocks of 64 keys in V tiles of 64, 4 warps,
    2 stages: forward 1.28 → 1.05 ms (fla 1.05 in that run), fwd+bwd 3.68 → 3.46; then
    (session 13, call c) the output kernel over key blocks of 64 in V tiles of 128 at 3
    stages, its loads pipelined: forward 0.861 → 0.778 ms (fla 0.927 in that run). Session
    14 (call a): K 128 takes the same output kernel (forward 0.938 → 0.915 ms, 0.943 / 0.954
    in session 13's call c) and both train with the key-gradient kernel's V-tile loop
    pipelined at 3 stages (K 256: fwd+bwd 3.20 → 2.99 ms, 2 stages 3.15; K 128: 2.92 →
    2.89, call b). Session 15: a forward alone at K 128 merges the inverse's blocks in TF32
    (Round 18: forward 0.941 → 0.902 and 1.01 → 0.934 ms in two calls; at K 256 and in
    training no gain, 0.769 → 0.771, fwd+bwd 2.92 → 2.97 at K 128); session 20: and reads
    all of `chunk_prepare`'s inputs first (its kernels 0.848 → 0.817 ms). Below K 128 nothing of
    Round 10 was measured, and float32 inputs need twice the shared memory (K 128's V 64 at 4
    stages asks 280 KB of the H200's 227, session 12 call b): the earlier defaults stay there
    (a forward alone below K 128 fused in V tiles of 64). Session 16 (call a): training
    makes the pair gradients' V tiles a pipelined loop (Round 21): `chunk_pair_gradients`
    318 → 243 µs a call at K 256, fwd+bwd 2.96 → 2.88 ms (K 256) and 2.88 → 2.77 (K 128);
    (call c) above K 128 the reverse pass runs in flight at 2 stages in key blocks of 128
    (Round 22): `chunk_state_gradients` 937 → 811 µs, the op's kernels 2.81 → 2.69 ms."""
    if itemsize > 2:
        return _measured_before_round_10(key_dim, value_dim, training)
    programs = None if sequences is None else sequences * -(-value_dim // 64)  # of 64 columns
    if key_dim < 128:
        # K = V = 64 (oryx-gdn-340m), training with documents: the forward state pass in V
        # tiles of 64 at 4 stages, fwd+bwd 1.716 → 1.649 ms (session 17 call c; GPU check
        # PASS at K 64, session 18 call a)
        base = _measured_before_round_10(key_dim, value_dim, training)
        few = programs is not None and programs < FEW_PROGRAMS_BELOW_K128
        if not training:
            # The fused forward alone (prefill), 12 heads (16 at 64 programs), V 64 / 32 / 16,
            # ms (session 37, H100, three rounds in each order): 12 programs 1.43 / 1.25 /
            # 1.18, 24 0.930 / 0.845 / 0.833, 48 0.689 / 0.655 / 0.659, 64 0.773 / 0.746 /
            # 0.742, 128 0.674 / 0.680 / 0.822
            tile = (64 if programs is None or programs > FEW_PROGRAMS else 16 if few else 32)
            return dataclasses.replace(base, value_block=min(value_dim, tile))
        # gdn-130m (12 heads) at B 1 × T 32768: 12 and 24 programs of V 64 and 32, 332,738 →
        # 350,541 tokens/s at V 16 in both passes; at B 4 × 8192 (48) V 16 loses 0.8 % (H100)
        narrow = dict(value_block=min(value_dim, 16)) if few else {}
        return dataclasses.replace(base, forward_value_block=min(value_dim, 16 if few else 64),
                                   forward_state_num_stages=4, **narrow)
    base = _measured_before_round_10(key_dim, value_dim, True)
    from_k128 = dict(forward_value_block=min(value_dim, 64),
                     outputs_value_block=min(value_dim, 128), outputs_key_block=64,
                     outputs_num_stages=3, pipelined_key_gradients=True, gradient_num_stages=3,
                     pipelined_pair_gradients=True)
    k128 = dict(forward_state_num_stages=4, tf32_merges=not training,
                prepare_loads_first=not training)
    wider = dict(forward_state_key_block=64, forward_state_num_warps=4,
                 forward_state_num_stages=2, value_block=min(value_dim, 64))
    by_key_dim = k128 if key_dim == 128 else wider
    # Round 22 (session 16 call c, K 256 training): the reverse pass in flight,
    # `chunk_state_gradients` 937 → 811 µs a call; not measured at K 128
    reverse = (dict(reverse_in_flight=True, state_num_stages=2, reverse_state_key_block=128)
               if training and key_dim > 128 else dict(state_num_stages=1))
    blocks = dataclasses.replace(base, reverse_small_scales=True,
                                 state_num_warps=8 if training and key_dim > 128 else 4,
                                 **reverse, **from_k128, **by_key_dim)
    if key_dim > 128 and programs is not None and programs < FEW_PROGRAMS:
        narrow = min(value_dim, 32)
        blocks = dataclasses.replace(blocks, value_block=narrow, forward_value_block=narrow)
    elif key_dim == 128 and not training and programs is not None and programs <= FEW_PROGRAMS:
        # K 128, a forward alone (16 heads, session 36, H100): its state pass at V 32, B 1 ×
        # 32768 (32 programs) 1.81 → 1.43 ms, B 2 × 16384 (64) 1.31 → 1.18; B 4 (128) +19 %
        blocks = dataclasses.replace(blocks, forward_value_block=min(value_dim, 32))
    return blocks


def _measured_before_round_10(key_dim: int, value_dim: int, training: bool) -> BlockSizes:
    """The defaults of NOTES.md Rounds 3-6 (see `default_block_sizes`)."""
    tile = min(value_dim, 64 if key_dim <= 128 and not training else 32)
    # The split per-chunk gradients at 4 warps: fwd+bwd 4.15 ms against 5.98 fused (8 warps)
    # and 5.27 split at 8 warps (NOTES.md Round 3); at K = 256, 7.34 against 8.15 at 8 warps
    # (Round 6).
    return BlockSizes(value_block=tile, gradient_key_block=min(key_dim, 64),
                      gradient_value_block=min(value_dim, 64), split_gradients=True,
                      gradient_num_warps=4, inverse_by_block=True,
                      split_outputs=training or key_dim > 128,
                      state_num_warps=8 if training and key_dim > 128 else 4)
