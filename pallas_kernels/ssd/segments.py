"""Sequence segments: the SSD kernels run on S equal segments of each row, combined exactly.

The kernels walk all chunks of a row serially in one program per (row, head, P-tile), so at a
few rows of long sequences the GPU holds few programs, each a long chain (NOTES.md, round 3).
Splitting each padded row `[T]` into S segments `[T/S]` (whole chunks) and running the kernels
on `[B·S, T/S]` gives S times the programs and chains S times shorter. Segment 0 runs from the
row's initial state, every other segment k from zero, giving local outputs and a final state
F_k; per head the segment maps an entering state S_in to D_k·S_in + F_k, with

    w_t = e^{cum_t}·[no document start in the segment up to and including t]
    D_k = w at the segment's last token

(cum: the inclusive cumulative log decay from the segment's first token; document starts come
from the original row, so a segment whose first token starts a document has w = 0 from it on).
The true entering states are S_in_0 = 0 (the initial state is inside F_0), S_in_{k+1} =
D_k S_in_k + F_k; the row's final state is D_{S−1} S_in_{S−1} + F_{S−1}; and each token t of a
segment k ≥ 1 adds the entering state's readout, y_t += w_t·S_in_k C_t. All of it is float32
XLA, differentiated by autodiff; the kernels' own VJP takes the local final states' cotangents.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32
PROGRAMS_PER_SM = 1  # at 2 (S = 2 at 4 × 8192) fwd+bwd was 25 % slower (NOTES.md, round 3)
MIN_CHUNKS = 8  # per segment
FALLBACK_SMS = 132  # H100 / H200 SXM, the GPUs the rule was set on


def choose_segments(programs: int, num_chunks: int, sms: int) -> int:
    """S: the largest power of two with `programs·S ≤ PROGRAMS_PER_SM·sms` (programs: the
    forward's B·H·P/block_p) whose segments keep ≥ `MIN_CHUNKS` chunks (`num_chunks ≥
    MIN_CHUNKS·S`); 1 when no S > 1 qualifies."""
    segments = 1
    while (programs * segments * 2 <= PROGRAMS_PER_SM * sms
           and num_chunks >= MIN_CHUNKS * segments * 2):
        segments *= 2
    return segments


def sm_count() -> int:
    """Streaming multiprocessors of the first local device (`core_count` of a GPU device); where the
    device does not say (a CPU device, e.g. a lowering test), `FALLBACK_SMS`."""
    return getattr(jax.local_devices()[0], "core_count", None) or FALLBACK_SMS


def split(v: jax.Array, segments: int) -> jax.Array:
    """`[B, T, ...]` -> `[B·S, T/S, ...]` (a reshape: segment k of row b is row b·S + k)."""
    batch, length = v.shape[:2]
    return v.reshape((batch * segments, length // segments) + v.shape[2:])


def combine(y_local: jax.Array, final_local: jax.Array, log_decay: jax.Array,
            starts: jax.Array | None, C: jax.Array, segments: int):
    """The row's outputs and final state from its segments' (module docstring).

    Args:
      y_local: `[B·S, T/S, H, P]` each segment's outputs (segment 0 from the initial state,
        the others from zero). final_local: `[B·S, H, P, N]` float32, their final states.
      log_decay: `[B, T, H]` float32 dt·A (0 at document starts, as the kernels take it).
      starts: `[B, T]` bool, the original row's document starts (False at token 0), or None.
      C: `[B, T, G, N]` in the kernels' operand dtype; T is padded, a multiple of S.

    Returns:
      `(y [B, T, H, P] in y_local's dtype, final state [B, H, P, N] float32)`.
    """
    batch, length, heads = log_decay.shape
    groups, state_dim = C.shape[2:]
    head_dim = y_local.shape[-1]
    rows = lambda v: v.reshape((batch, segments) + v.shape[1:])  # [B·S, ...] -> [B, S, ...]
    weight_BSLH = jnp.exp(jnp.cumsum(rows(split(log_decay, segments)), axis=2))
    if starts is not None:
        started = jnp.cumsum(rows(split(starts, segments)), axis=2, dtype=jnp.int32) > 0
        weight_BSLH = jnp.where(started[..., None], 0.0, weight_BSLH)
    decay_BSH = weight_BSLH[:, :, -1]
    finals = rows(final_local)
    entering = [finals[:, 0]]  # the state entering segment 1
    for k in range(1, segments):
        entering.append(decay_BSH[:, k, :, None, None] * entering[-1] + finals[:, k])
    final_state = entering.pop()
    # Segments 1..S−1: y_t += w_t · S_in C_t (`_entering_readout`).
    state_BSGRPN = jnp.stack(entering, axis=1).reshape(
        batch, segments - 1, groups, heads // groups, head_dim, state_dim)
    y = rows(y_local)
    term = _entering_readout(rows(split(C, segments))[:, 1:], state_BSGRPN,
                             weight_BSLH[:, 1:])
    later = (y[:, 1:].astype(F32) + term.reshape(y[:, 1:].shape)).astype(y.dtype)
    y = lax.dynamic_update_slice_in_dim(y, later, 1, axis=1)
    return y.reshape(batch, length, heads, head_dim), final_state


@jax.checkpoint
def _entering_readout(C_BSLGN, state_BSGRPN, weight_BSLH):
    """`w_t · S_in C_t` of segments 1..S−1, float32 `[B, S−1, L, G, H/G, P]`: operands in C's
    dtype, float32 sums rounded to C's dtype (the kernels' readout of their entering state,
    which they store in the outputs' dtype), then weighted in float32; head h reads group
    h // (H/G). Recomputed in the backward: kept, the float32 product is the op's largest
    residual when S > 1 (192 MiB a layer for mamba2-340m at B1 T32768, S = 4: the model's
    memory grew 16 % from T 8192 to 32768 at the same tokens a step), and it costs one
    [L, N] × [N, P] product a head to make again."""
    readout = _readout(C_BSLGN, state_BSGRPN.astype(C_BSLGN.dtype))
    groups, per_group = state_BSGRPN.shape[2:4]
    weight = weight_BSLH.reshape(weight_BSLH.shape[:3] + (groups, per_group))
    return weight[..., None] * readout


def _product(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(spec, a, b, preferred_element_type=F32, precision=lax.Precision.HIGHEST)


@jax.custom_vjp
def _readout(C_BSLGN, state_BSGRPN):
    """`S_in C_t` `[B, S−1, L, G, H/G, P]` in the operands' dtype (float32 sums; bf16 halves
    the bytes of the largest array of the combine, session 36). Its backward takes the
    cotangent in that dtype too: autodiff's transposes multiplied the float32 cotangent with
    the operands promoted to float32, which the GPU ran as FFMA GEMMs without tensor cores
    (mamba2-340m at B1 T32768: 15 ms a step, session 34)."""
    return _product("bslgn,bsgrpn->bslgrp", C_BSLGN, state_BSGRPN).astype(C_BSLGN.dtype)


def _readout_fwd(C_BSLGN, state_BSGRPN):
    return _readout(C_BSLGN, state_BSGRPN), (C_BSLGN, state_BSGRPN)


def _readout_bwd(residuals, d_readout):
    C_BSLGN, state_BSGRPN = residuals
    d = d_readout.astype(C_BSLGN.dtype)
    return (_product("bslgrp,bsgrpn->bslgn", d, state_BSGRPN).astype(C_BSLGN.dtype),
            _product("bslgrp,bslgn->bsgrpn", d, C_BSLGN).astype(state_BSGRPN.dtype))


_readout.defvjp(_readout_fwd, _readout_bwd)
