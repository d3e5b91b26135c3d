"""Gated Slot Attention (GSA, Zhang et al. 2024): softmax attention over M gated memory slots.

Per step t and head, with slot keys `K̃` `[K, M]` and slot values `Ṽ` `[M, V]` (zeros unless
`initial_state` is given), slot write weights `s_t` and log forget gates `g_t ≤ 0` (both `[M]`):

    K̃_t = K̃_{t−1}·diag(e^{g_t}) + k_t s_tᵀ
    Ṽ_t = diag(e^{g_t})·Ṽ_{t−1} + s_t v_tᵀ
    ℓ_t = scale·K̃_tᵀ q_t                   slot logits `[M]`
    o_t = Ṽ_tᵀ softmax(ℓ_t)                 softmax over the M slots, in float32

Layout `[batch, time, heads, dim]`. Recurrent math and the softmax run in float32 (float64
stays float64); outputs have the dtype of `q`.

Rungs: "reference" (per-token `lax.scan`, the definition), "xla" (the two-pass chunked form)
and "pallas" (the NHA kernels of `pallas_kernels.nha` at window 0, GPU bf16/fp16 or TPU
bf16/f32 inputs: NHA without a window is GSA; documents and initial/final states included;
auto picks it on a GPU where supported, a TPU runs it when named).
`gated_slot_attention_step` advances one token (decoding).

The two passes of the chunked form are public, for ops that attend to the slots together with
other keys (NHA: slots and a sliding window under one softmax):

* `gsa_slot_logits(q, k, s, g)`: the slot logits ℓ_t `[B, T, H, M]` of every token, before the
  softmax: `ℓ_{t,m} = scale Σ_{j≤t} e^{G_{t,m}−G_{j,m}} s_{j,m} (q_t·k_j)` (G the cumulative
  log gate), a gated linear attention with keys k, values s and the decay on the value axis.
* `gsa_slot_readout(p, v, s, g)`: `Ṽ_tᵀ p_t` `[B, T, H, V]` for any slot weights p
  `[B, T, H, M]`: `Σ_{j≤t} Σ_m p_{t,m} e^{G_{t,m}−G_{j,m}} s_{j,m} v_j`, a gated linear
  attention with queries p, keys s, values v and the decay on the key axis.

Both take `delay=w`: the slots at step t then hold only the tokens ≤ t − w (the slot inputs
k, v, s, g are shifted w steps later in time, with empty writes and no decay entering), and
the final state is the slot state after token T − w. A caller that continues a sequence from a
cache shifts the inputs itself instead (prepending the previous segment's last w slot inputs)
and passes `delay=0`.

Chunked form. Time is cut into chunks of C steps (C a power of two; any T, zero-padded). A
`lax.scan` over chunks computes each chunk's outputs from the state entering it plus the
chunk's own pairs j ≤ t, then advances the state. The chunk step is under `jax.checkpoint`, so
the backward pass keeps only the entering states (one `[K, M]` / `[M, V]` per chunk) and
recomputes the `[C, C]`-sized tensors of one chunk at a time: memory O(T·(K + V + M)) plus the
chunk states, never a state per token.

Within a chunk the decay between steps j < t is `e^{G_t−G_j}` with G the cumulative log gate
from the chunk start (non-increasing). Factorising it at a fixed point would overflow for
strongly negative gates, and materialising `[C, C, M]` costs C·M numbers per token. Instead
the pairs are split by level (recursive secondary chunking): pair (j, t) belongs to level l
when j and t lie in the same block of 2^{l+1} steps, j in its left half and t in its right
half; there the decay factorises at the block midpoint r (last step of the left half) as
`e^{G_t−r}·e^{r−G_j}`, both factors ≤ 1. Each level is then one matmul, masked to its pairs
after the product, and nothing overflows however negative g is (a factor that underflows to 0
belongs to a pair whose true weight is below the float range anyway). With L = log2(C) levels
this costs L·C²·M flops per chunk and pass (the exact blockwise split needs C²·M/2; a kernel
should do that). Pairs j = t carry no decay.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.ops.checks import check_dims, check_floating
from hybrid_jax.ops.dispatch import Rung, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.partition import shard_kernel
from hybrid_jax.ops.scan import compute_dtype, from_time_chunks, time_chunks, varying_scan
from hybrid_jax.ops.segments import document_starts, reset_log_decay, reset_state
from pallas_kernels.nha import api as pallas_nha

_OP = "gated_slot_attention"

SlotState = tuple[jax.Array, jax.Array]
"""`(K̃ [B, H, K, M], Ṽ [B, H, M, V])`: slot keys and slot values of every head."""


@typed_like_inputs
def gated_slot_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    scale: float | None = None,
    initial_state: SlotState | None = None,
    return_final_state: bool = False,
    chunk_size: int = 64,
    segment_ids: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, SlotState]:
    """Gated slot attention over a sequence (see the module docstring for the recurrence).

    Args:
      q, k: `[B, T, H, K]` queries and keys.
      v: `[B, T, H, V]` values.
      s: `[B, T, H, M]` slot write weights (GSA uses `1 − e^{g}`).
      g: `[B, T, H, M]` log forget gates (≤ 0).
      scale: logit scale, default `K**-0.5`.
      initial_state: `(K̃ [B, H, K, M], Ṽ [B, H, M, V])` before the first step; None for zeros.
      return_final_state: also return the state after the last step.
      chunk_size: chunk length of the "xla" rung, a power of two (any T).
      segment_ids: `[B, T]` packed-document ids; the slots reset at each document start
        (`hybrid_jax.ops.segments`), whose token then writes as it would alone.
      implementation: "pallas", "reference", "xla" or None (auto).

    Returns:
      `o` `[B, T, H, V]` in the dtype of `q`, or `(o, (K̃, Ṽ))` with the final state in float32
      (float64 for float64 inputs).
    """
    slot_keys, slot_values = _unpack_state(_OP, initial_state)
    _check(_OP, chunk_size, q=(q, "BTHK"), k=(k, "BTHK"), v=(v, "BTHV"), s=(s, "BTHM"),
           g=(g, "BTHM"), slot_keys=(slot_keys, "BHKM"), slot_values=(slot_values, "BHMV"))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    starts = document_starts(_OP, segment_ids, q.shape[0], q.shape[1])
    out, final_state = dispatch(
        _OP, _RUNGS, implementation, q, k, v, s, g,
        scale=scale, chunk_size=chunk_size, initial_state=initial_state, starts=starts,
    )
    return (out, final_state) if return_final_state else out


@typed_like_inputs
def gated_slot_attention_step(
    state: SlotState,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, SlotState]:
    """One token of gated slot attention (decoding).

    Args:
      state: `(K̃ [B, H, K, M], Ṽ [B, H, M, V])` before this token.
      q, k: `[B, H, K]`; v: `[B, H, V]`; s, g: `[B, H, M]`.
      scale: logit scale, default `K**-0.5`.

    Returns:
      `(o, new_state)`: `o` `[B, H, V]` in the dtype of `q`, the new `(K̃, Ṽ)` in float32
      (float64 for float64 inputs).
    """
    op = f"{_OP}_step"
    slot_keys, slot_values = _unpack_state(op, state)
    if slot_keys is None:
        raise ValueError(f"{op}: state is required, got None")
    check_dims(op, {}, slot_keys=(slot_keys, "BHKM"), slot_values=(slot_values, "BHMV"),
               q=(q, "BHK"), k=(k, "BHK"), v=(v, "BHV"), s=(s, "BHM"), g=(g, "BHM"))
    check_floating(op, slot_keys=slot_keys, slot_values=slot_values, q=q, k=k, v=v, s=s, g=g)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(slot_keys, slot_values, q, k, v, s, g)
    new_state, out = _step((slot_keys.astype(dtype), slot_values.astype(dtype)),
                           *(x.astype(dtype) for x in (q, k, v, s, g)), scale=scale)
    return out.astype(q.dtype), new_state


@typed_like_inputs
def gsa_slot_logits(
    q: jax.Array,
    k: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    chunk_size: int = 64,
    delay: int = 0,
    return_final_state: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Pass 1 of chunked GSA: the slot logits `ℓ_t = scale·K̃_{t−delay}ᵀ q_t` before the softmax.

    Args:
      q, k: `[B, T, H, K]`; s, g: `[B, T, H, M]` (as in `gated_slot_attention`).
      scale: logit scale, default `K**-0.5`.
      initial_state: slot keys K̃ `[B, H, K, M]` before the first (delayed) write; None: zeros.
      chunk_size: chunk length, a power of two (any T).
      delay: w ≥ 0; the slots at step t hold the tokens ≤ t − w (module docstring).
      return_final_state: also return K̃ after token T − delay.

    Returns:
      `[B, T, H, M]` logits in float32 (float64 for float64 inputs), or `(logits, K̃)`.
    """
    op = "gsa_slot_logits"
    _check(op, chunk_size, delay, q=(q, "BTHK"), k=(k, "BTHK"), s=(s, "BTHM"), g=(g, "BTHM"),
           initial_state=(initial_state, "BHKM"))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(q, k, s, g, initial_state)
    if initial_state is None:
        initial_state = jnp.zeros((q.shape[0], q.shape[2], q.shape[3], s.shape[3]), dtype)
    inputs = [scale * q.astype(dtype)] + [_delayed(x, delay).astype(dtype) for x in (k, s, g)]
    final_state, logits = varying_scan(
        _logits_chunk, initial_state.astype(dtype), [time_chunks(x, chunk_size) for x in inputs])
    logits = from_time_chunks(logits, q.shape[1])
    return (logits, final_state) if return_final_state else logits


@typed_like_inputs
def gsa_slot_readout(
    p: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    initial_state: jax.Array | None = None,
    chunk_size: int = 64,
    delay: int = 0,
    return_final_state: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Pass 2 of chunked GSA: `Ṽ_{t−delay}ᵀ p_t` for slot weights p (e.g. softmax probabilities).

    Args:
      p: `[B, T, H, M]` weights of the slots for every query.
      v: `[B, T, H, V]`; s, g: `[B, T, H, M]` (as in `gated_slot_attention`).
      initial_state: slot values Ṽ `[B, H, M, V]` before the first (delayed) write; None: zeros.
      chunk_size: chunk length, a power of two (any T).
      delay: w ≥ 0; the slots at step t hold the tokens ≤ t − w (module docstring).
      return_final_state: also return Ṽ after token T − delay.

    Returns:
      `[B, T, H, V]` in float32 (float64 for float64 inputs), or `(out, Ṽ)`.
    """
    op = "gsa_slot_readout"
    _check(op, chunk_size, delay, p=(p, "BTHM"), v=(v, "BTHV"), s=(s, "BTHM"), g=(g, "BTHM"),
           initial_state=(initial_state, "BHMV"))
    dtype = compute_dtype(p, v, s, g, initial_state)
    if initial_state is None:
        initial_state = jnp.zeros((p.shape[0], p.shape[2], p.shape[3], v.shape[3]), dtype)
    inputs = [p.astype(dtype)] + [_delayed(x, delay).astype(dtype) for x in (v, s, g)]
    final_state, out = varying_scan(
        _readout_chunk, initial_state.astype(dtype), [time_chunks(x, chunk_size) for x in inputs])
    out = from_time_chunks(out, p.shape[1])
    return (out, final_state) if return_final_state else out


@jax.checkpoint
def _logits_chunk(slot_keys, chunk):
    """Logits of one chunk and the slot keys after it. q, k `[B, H, C, K]`; s, g `[B, H, C, M]`;
    slot_keys `[B, H, K, M]`."""
    q, k, s, g = chunk
    writes = _slot_writes(s, g)
    scores = jnp.einsum("bhtk,bhjk->bhtj", q, k)
    logits = writes.entry * jnp.einsum("bhtk,bhkm->bhtm", q, slot_keys)
    logits += jnp.einsum("bhtt->bht", scores)[..., None] * s  # pairs j = t
    by_level = scores[:, :, None] * _pair_levels(q.shape[2])  # [B, H, L, C(t), C(j)]
    logits += jnp.sum(
        writes.level_decay * jnp.einsum("bhltj,bhljm->bhltm", by_level, writes.level_write),
        axis=2)
    slot_keys = (writes.chunk[..., None, :] * slot_keys
                 + jnp.einsum("bhjk,bhjm->bhkm", k, writes.s_exit))
    return slot_keys, logits


@jax.checkpoint
def _readout_chunk(slot_values, chunk):
    """Readout of one chunk and the slot values after it. p, s, g `[B, H, C, M]`; v
    `[B, H, C, V]`; slot_values `[B, H, M, V]`."""
    p, v, s, g = chunk
    writes = _slot_writes(s, g)
    out = jnp.einsum("bhtm,bhmv->bhtv", p * writes.entry, slot_values)
    by_level = jnp.einsum("bhltm,bhljm->bhltj", p[:, :, None] * writes.level_decay,
                          writes.level_write)  # [B, H, L, C(t), C(j)]
    weights = jnp.sum(by_level * _pair_levels(p.shape[2]), axis=2)
    weights += jnp.sum(p * s, axis=-1)[..., None] * jnp.eye(p.shape[2], dtype=p.dtype)  # j = t
    out += jnp.einsum("bhtj,bhjv->bhtv", weights, v)
    slot_values = (writes.chunk[..., :, None] * slot_values
                   + jnp.einsum("bhjm,bhjv->bhmv", writes.s_exit, v))
    return slot_values, out


class _SlotWrites(NamedTuple):
    """The decays of one chunk, `[B, H, ...]`; G the cumulative log gate from the chunk start
    (inclusive), L = log2(C) levels (module docstring). Every exponent is ≤ 0."""

    entry: jax.Array  # e^{G_t}, decay from the entering state to t: [.., C, M]
    s_exit: jax.Array  # s_j·e^{G_C−G_j}, write j as seen at the chunk end: [.., C, M]
    chunk: jax.Array  # e^{G_C}, decay across the whole chunk: [.., M]
    level_decay: jax.Array  # e^{G_t−r} right of midpoint r, else e^{r−G_t}: [.., L, C, M]
    level_write: jax.Array  # s_t·level_decay: [.., L, C, M]


def _slot_writes(s: jax.Array, g: jax.Array) -> _SlotWrites:
    log_decay = jnp.cumsum(g, axis=2)  # [B, H, C, M]
    in_right_half, midpoint = _level_halves(g.shape[2])
    from_midpoint = log_decay[:, :, None] - log_decay[:, :, midpoint]  # [B, H, L, C, M]
    level_decay = jnp.exp(jnp.where(in_right_half[:, :, None], from_midpoint, -from_midpoint))
    return _SlotWrites(
        entry=jnp.exp(log_decay),
        s_exit=s * jnp.exp(log_decay[:, :, -1:] - log_decay),
        chunk=jnp.exp(log_decay[:, :, -1]),
        level_decay=level_decay,
        level_write=s[:, :, None] * level_decay,
    )


def _level_halves(chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per level l (blocks of 2^{l+1} steps) and step t: whether t lies in the right half of its
    block, and the block's midpoint (the last step of its left half). Both `[L, C]`."""
    step = np.arange(chunk_size)
    half = 2 ** np.arange(chunk_size.bit_length() - 1)[:, None]
    return (step // half) % 2 == 1, (step // (2 * half)) * 2 * half + half - 1


def _pair_levels(chunk_size: int) -> np.ndarray:
    """`[L, C(t), C(j)]`: 1 where the pair j < t belongs to level l (same block, j in the left
    half, t in the right half), else 0. Every pair j < t belongs to exactly one level."""
    in_right_half, midpoint = _level_halves(chunk_size)
    same_block = midpoint[:, :, None] == midpoint[:, None, :]
    return (same_block & in_right_half[:, :, None] & ~in_right_half[:, None, :]).astype(np.float32)


def _delayed(x: jax.Array, delay: int) -> jax.Array:
    """x shifted `delay` steps later in time, zeros entering: `x'_t = x_{t−delay}`."""
    if delay == 0:
        return x
    return jnp.pad(x, [(0, 0), (delay, 0)] + [(0, 0)] * (x.ndim - 2))[:, : x.shape[1]]


def _step(state, q, k, v, s, g, *, scale):
    """The recurrence for one token; every array in the compute dtype, heads before features."""
    slot_keys, slot_values = state
    forget = jnp.exp(g)
    slot_keys = slot_keys * forget[..., None, :] + k[..., :, None] * s[..., None, :]
    slot_values = forget[..., :, None] * slot_values + s[..., :, None] * v[..., None, :]
    logits = jnp.einsum("bhkm,bhk->bhm", slot_keys, scale * q)
    out = jnp.einsum("bhmv,bhm->bhv", slot_values, jax.nn.softmax(logits, axis=-1))
    return (slot_keys, slot_values), out


def gated_slot_attention_reference(q, k, v, s, g, *, scale, chunk_size, initial_state, starts):
    """The definition: `_step` token by token with `lax.scan`, the slots zeroed at document
    starts."""
    del chunk_size
    dtype = compute_dtype(q, k, v, s, g, *(initial_state or ()))
    if initial_state is None:
        batch, _, heads, key_dim = q.shape
        slots = s.shape[-1]
        initial_state = (jnp.zeros((batch, heads, key_dim, slots), dtype),
                         jnp.zeros((batch, heads, slots, v.shape[-1]), dtype))
    state = tuple(x.astype(dtype) for x in initial_state)
    starts = jnp.zeros(q.shape[:2], bool) if starts is None else starts
    time_major = [jnp.moveaxis(x.astype(dtype), 1, 0) for x in (q, k, v, s, g)]
    final_state, out_TBHV = varying_scan(
        lambda st, xs: _step(tuple(reset_state(x, xs[0]) for x in st), *xs[1:], scale=scale),
        state, [jnp.moveaxis(starts, 1, 0)] + time_major)
    return jnp.moveaxis(out_TBHV, 0, 1).astype(q.dtype), final_state


def gated_slot_attention_xla(q, k, v, s, g, *, scale, chunk_size, initial_state, starts):
    """Two chunked passes: slot logits, softmax over slots (float32), slot readout; document
    starts enter through the log forget gate g."""
    slot_keys, slot_values = _unpack_state(_OP, initial_state)
    g = reset_log_decay(g.astype(compute_dtype(q, g)), starts)
    logits, final_keys = gsa_slot_logits(q, k, s, g, scale=scale, initial_state=slot_keys,
                                         chunk_size=chunk_size, return_final_state=True)
    probs = jax.nn.softmax(logits, axis=-1)
    out, final_values = gsa_slot_readout(probs, v, s, g, initial_state=slot_values,
                                         chunk_size=chunk_size, return_final_state=True)
    return out.astype(q.dtype), (final_keys, final_values)


def _kernel_context(q, k, v, s, g, initial_state, starts) -> dict:
    """The NHA kernels' `documents` and `initial_state` (an empty ring: no window) for a GSA
    call."""
    documents = None
    if starts is not None:
        documents = pallas_nha.Documents(jnp.cumsum(starts, axis=1, dtype=jnp.int32), starts)
    if initial_state is None:
        return dict(documents=documents, initial_state=None)
    empty = lambda x: x[:, :0]
    return dict(documents=documents, initial_state=pallas_nha.State(
        *initial_state, empty(k), empty(v), empty(s), empty(g), empty(k)))


def gated_slot_attention_pallas(q, k, v, s, g, *, scale, chunk_size, initial_state, starts):
    """The NHA kernels at window 0 (NHA without a window is GSA) on each device's batch and
    heads: slots, document resets and the initial and final slot states; the final state in
    float32."""
    del chunk_size

    def kernel(q, k, v, s, g, initial_state, starts):
        return pallas_nha.native_hybrid_attention(
            q, k, v, s, g, window=0, scale=scale, return_final_state=True,
            **_kernel_context(q, k, v, s, g, initial_state, starts))

    state = None if initial_state is None else tuple(initial_state)
    slot_layouts = ("BHKM", "BHMV")
    return shard_kernel(_OP, kernel, (q, k, v, s, g, state, starts),
                        ("BTHK", "BTHK", "BTHV", "BTHM", "BTHM", slot_layouts, "BT"),
                        ("BTHV", slot_layouts))


def _pallas_unsupported(q, k, v, s, g, *, scale, chunk_size, initial_state, starts):
    del scale, chunk_size
    return pallas_nha.unsupported(q, k, v, s, g, window=0,
                                  **_kernel_context(q, k, v, s, g, initial_state, starts))


_RUNGS = (
    # The NHA kernels at w = 0: chosen automatically on GPUs only, as NHA's rung (ops/nha.py).
    Rung("pallas", gated_slot_attention_pallas, _pallas_unsupported, auto_platforms=("gpu",)),
    Rung("xla", gated_slot_attention_xla),
    Rung("reference", gated_slot_attention_reference, auto=False),
)


def _unpack_state(op: str, state: SlotState | None) -> tuple[jax.Array | None, jax.Array | None]:
    if state is None:
        return None, None
    if not (isinstance(state, tuple | list) and len(state) == 2):
        raise ValueError(f"{op}: the slot state must be a pair (K̃ [B,H,K,M], Ṽ [B,H,M,V]), "
                         f"got {type(state).__name__}")
    return state[0], state[1]


def _check(op: str, chunk_size: int, delay: int = 0, **arrays: tuple[jax.Array | None, str]):
    """Validates arrays given as `name=(array or None, layout)` and the chunking arguments."""
    arrays = {name: pair for name, pair in arrays.items() if pair[0] is not None}
    check_dims(op, {}, **arrays)
    check_floating(op, **{name: x for name, (x, _) in arrays.items()})
    if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"{op}: chunk_size must be a power of two, got {chunk_size!r}")
    if not isinstance(delay, int) or delay < 0:
        raise ValueError(f"{op}: delay must be an int >= 0, got {delay!r}")
