"""Native Hybrid Attention (NHA, Du et al. 2025): gated slots and a sliding window, one softmax.

Per step t and query head, with window w ≥ 0 and M slots:

    slots     K̃, Ṽ: the gated-slot recurrence of `hybrid_jax.ops.gsa` over the tokens ≤ t − w
              (K̃_j = K̃_{j−1}·diag(e^{g_j}) + k_j s_jᵀ,  Ṽ_j = diag(e^{g_j})·Ṽ_{j−1} + s_j v_jᵀ)
    window    the tokens t−w+1 .. t (w of them, t included)
    logits    ℓ_t = [ scale·K̃ᵀ q_t  ;  scale·q̂_tᵀ k̂_j  for j in the window ]   (M + w entries)
    p_t       = softmax(ℓ_t), ONE softmax over slots and window, in float32
    o_t       = Ṽᵀ p_slots + Σ_j p_j v_j

q, k are the slot-branch query/key (after the caller's feature map), q̂, k̂ the window-branch ones
(`q_window`, `k_window`, default q, k; RoPE is the caller's). Only tokens that have left the
window enter the slots (the slot inputs are shifted w steps later), so slots and window are
disjoint and together cover the prefix. A token t−w enters the slots at step t.

Empty slots. While no token of the current document has entered the slots (t − w < start),
`empty_slots="mask"` (default) leaves the slot logits out of the softmax: `window >= T` is then
exactly causal softmax attention and `window = 0` exactly GSA. `empty_slots="sink"` reproduces
the original NHA code (JusenD/NHA at 7dffc04), where the empty slots still take part as M
zero-value sinks (logit 0, value 0).

Heads. q, q_window have H heads; k, v, s, g, k_window have G heads, G dividing H (grouped
query heads h·G/H share kv head ⌊h·G/H⌋: its slot memory and its window keys/values).

Documents. `segment_ids` `[B, T]` marks packed documents: a token whose id differs from the
previous token's starts a document (`hybrid_jax.ops.segments`). Windows never cross a document
start, and a document start resets the slots when it enters them (its log gate becomes
`segments.RESET_LOG_DECAY`, e^{−120} = 0 in float32); until then the slots count as empty.

State (continuing a sequence). `NHAState` is the decode state after L tokens: the slots
(tokens ≤ L − 1 − w), a ring buffer with every input of the last w tokens (token p at index
p % w: slot-branch key, value, s, g — they enter the slots as they leave the ring — and window
key), the length L and where the current document starts. Pass it as `initial_state` to
continue: `[0:t]` then `[t:T]` with the carried state equals `[0:T]` (without `segment_ids`;
with them, the state continues the document of the call's first token). `window` must equal
the ring length. `nha_empty_state` builds the state of an empty sequence;
`native_hybrid_attention_step` advances it by one token (decoding), O(M·(K+V) + w·(D+V)) per
head.

Rungs: "attention" (idle slots, empty ones masked: causal attention of the window branch by
`ops.attention`, auto on an accelerator where that takes a kernel), "pallas" (the kernels of
`pallas_kernels.nha`: GPU bf16/fp16 calls, head dims 64, 128
or 256, with segment ids, states and GQA; auto picks it where supported; a gate of
`RESET_LOG_DECAY` in every slot and kv head counts as a document start there, as it does in
the other rungs numerically; exact for gates of any strength, as the XLA rung:
`pallas_kernels.nha.chunk_math`),
"reference" (per-token `lax.scan`, the definition; every query against all keys, masked to its
window) and "xla" (chunkwise parallel, chunks of C tokens):

* slot logits: `gsa_slot_logits` over the shifted slot inputs (a chunked scan; memory
  O(T·(K+M)) plus one state per chunk);
* window logits as a banded block: query chunk c meets only the key chunks that intersect its
  windows, nb = ⌈(w−1)/C⌉ + 1 of them for any w (also w > C), `[C, nb·C]` logits per chunk;
* one float32 softmax over `[slots ; band]`, then `gsa_slot_readout` for Ṽᵀp_slots plus the
  band's values.

Memory is O(T·(K + V + M + nb·C)) per head: linear in T, no T×T buffer and no state per token.

Building blocks for kernels: `nha_slot_stream` (the slot inputs entering at each step, with the
masks) and `nha_chunk_states` (the slot states entering each chunk).

Layout `[batch, time, heads, dim]`. Recurrent math and the softmax run in float32 (float64 stays
float64); outputs have the dtype of `q`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.ops.attention import attention, attention_rung, masked_softmax
from hybrid_jax.ops.checks import (
    check_choice,
    check_count,
    check_dims,
    check_divides,
    check_floating,
    check_integer,
)
from hybrid_jax.ops.dispatch import Rung, backend, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.gsa import gsa_slot_logits, gsa_slot_readout
from hybrid_jax.ops.partition import shard_kernel
from hybrid_jax.ops.scan import chunk_state_scan, compute_dtype, to_chunks, varying_scan
from hybrid_jax.ops.segments import (
    RESET_LOG_DECAY,
    document_index,
    document_starts,
    reset_log_decay,
)
from pallas_kernels.nha import api as pallas_nha

_OP = "native_hybrid_attention"

EMPTY_SLOTS = ("mask", "sink")


class NHAState(NamedTuple):
    """NHA decode state after `length` tokens, per kv head (G heads, ring of W = window tokens).

    The ring holds token p at index `p % W`; entries of tokens p < 0 are zeros (they write
    nothing when they enter the slots). Only ring tokens p ≥ `document_start` are visible.
    """

    slot_keys: jax.Array  # [B, G, K, M]  K̃ over the tokens ≤ length − 1 − W
    slot_values: jax.Array  # [B, G, M, V]  Ṽ
    keys: jax.Array  # [B, W, G, K]  slot-branch keys of the last W tokens
    values: jax.Array  # [B, W, G, V]
    s: jax.Array  # [B, W, G, M]
    g: jax.Array  # [B, W, G, M]  RESET_LOG_DECAY at a document start
    window_keys: jax.Array  # [B, W, G, D]
    length: jax.Array  # [] int32: tokens consumed
    document_start: jax.Array  # [B] int32: position where the current document starts


class NHASlotStream(NamedTuple):
    """The slot inputs entering at each step of a call (token t − w at step t) and the masks."""

    k: jax.Array  # [B, T, G, K]
    v: jax.Array  # [B, T, G, V]
    s: jax.Array  # [B, T, G, M]
    g: jax.Array  # [B, T, G, M]  RESET_LOG_DECAY where a document start enters
    slots_visible: jax.Array  # [B, T] bool: the slots hold a token of t's document


@typed_like_inputs
def native_hybrid_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    window: int,
    scale: float | None = None,
    q_window: jax.Array | None = None,
    k_window: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    initial_state: NHAState | None = None,
    return_final_state: bool = False,
    empty_slots: str = "mask",
    chunk_size: int = 64,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, NHAState]:
    """Native hybrid attention over a sequence (see the module docstring).

    Args:
      q: `[B, T, H, K]` slot-branch queries.
      k: `[B, T, G, K]` slot-branch keys; G divides H.
      v: `[B, T, G, V]` values (of slots and window alike).
      s: `[B, T, G, M]` slot write weights (NHA uses `1 − e^{g}`).
      g: `[B, T, G, M]` log forget gates (≤ 0).
      window: w ≥ 0, the number of most recent tokens attended to directly.
      scale: logit scale of both branches, default `K**-0.5`.
      q_window: `[B, T, H, D]` window-branch queries (default q).
      k_window: `[B, T, G, D]` window-branch keys (default k).
      segment_ids: `[B, T]` int document ids of packed sequences.
      initial_state: `NHAState` to continue from (ring length == window); None: empty.
      return_final_state: also return the state after the last token.
      empty_slots: "mask" (leave empty slots out) or "sink" (zero-value sinks, original code).
      chunk_size: chunk length of the "xla" rung, a power of two (any T).
      implementation: "attention" (idle slots, empty ones masked — w ≥ T without a state,
        where the op is causal attention of the window branch — by `ops.attention`), "pallas",
        "reference", "xla" or None (auto: on an accelerator "attention" for idle slots where
        `ops.attention` takes a kernel; then "pallas" on a GPU where the kernels take the
        call, else "xla", logged; on a TPU "pallas" only when named).

    Returns:
      `o` `[B, T, H, V]` in the dtype of `q`, or `(o, NHAState)`; the state's arrays take the
      dtypes of `initial_state`'s (float32, float64 for float64 inputs, when None).
    """
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    check_inputs(q, k, v, s, g, q_window, k_window, window=window, segment_ids=segment_ids,
                 state=initial_state, empty_slots=empty_slots, chunk_size=chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(q, k, v, s, g, q_window, k_window)
    num_steps = q.shape[1]
    # Without a state no token precedes the call, so a window past T changes nothing.
    ring = window if initial_state is not None else min(window, num_steps)
    tokens = _tokens(k, v, s, g, k_window, segment_ids, initial_state, ring, dtype)
    group = q.shape[2] // k.shape[2]
    out, slot_keys, slot_values = dispatch(
        _OP, _RUNGS, implementation, q.astype(dtype), q_window.astype(dtype),
        _repeat_heads(tokens, group), _slots_visible(tokens, num_steps, ring),
        *(_repeat_heads(x, group, axis=1) for x in _initial_slots(tokens, initial_state, q, v)),
        window=ring, scale=scale, empty_slots=empty_slots, chunk_size=chunk_size,
        slots_idle=initial_state is None and window >= num_steps,
        call=_Call(q, k, v, s, g, q_window, k_window, tokens, segment_ids, initial_state,
                   return_final_state),
    )
    out = out.astype(q.dtype)
    if not return_final_state:
        return out
    final = _final_state(tokens, slot_keys[:, ::group], slot_values[:, ::group], segment_ids,
                         initial_state, window, num_steps)
    return out, final


@typed_like_inputs
def native_hybrid_attention_step(
    state: NHAState,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    q_window: jax.Array | None = None,
    k_window: jax.Array | None = None,
    scale: float | None = None,
    empty_slots: str = "mask",
) -> tuple[jax.Array, NHAState]:
    """One token of native hybrid attention (decoding); the window is the state's ring length.

    The token leaving the ring (position length − W) enters the slots, the new token takes its
    ring entry, and the query attends to the slots and the W ring tokens.

    Args:
      state: `NHAState` before this token (e.g. `nha_empty_state(...)`).
      q: `[B, H, K]`; k: `[B, G, K]`; v: `[B, G, V]`; s, g: `[B, G, M]`.
      q_window: `[B, H, D]` (default q); k_window: `[B, G, D]` (default k).
      scale: logit scale, default `K**-0.5`.
      empty_slots: "mask" or "sink" (module docstring).

    Returns:
      `(o, new_state)`: `o` `[B, H, V]` in the dtype of `q`; the state keeps its dtypes.
    """
    op = f"{_OP}_step"
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    if not isinstance(state, NHAState):
        raise ValueError(f"{op}: state must be an NHAState, got {type(state).__name__}")
    ring = state.keys.shape[1]
    sizes = check_dims(op, {}, q=(q, "BHK"), k=(k, "BGK"), v=(v, "BGV"), s=(s, "BGM"),
                       g=(g, "BGM"), q_window=(q_window, "BHD"), k_window=(k_window, "BGD"))
    check_floating(op, q=q, k=k, v=v, s=s, g=g, q_window=q_window, k_window=k_window)
    check_divides(op, "num_kv_heads (axis 1 of k) must divide num_heads (axis 1 of q)",
                  sizes["G"], sizes["H"])
    check_choice(op, "empty_slots", empty_slots, EMPTY_SLOTS)
    _check_state(op, state, sizes, ring)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(q, k, v, s, g, q_window, k_window, state.slot_keys)
    new = [x.astype(dtype) for x in (k, v, s, g, k_window)]
    slot_keys, slot_values = state.slot_keys.astype(dtype), state.slot_values.astype(dtype)
    length = state.length.astype(jnp.int32)
    ring_arrays = [x.astype(dtype) for x in
                   (state.keys, state.values, state.s, state.g, state.window_keys)]
    if ring == 0:
        slot_keys, slot_values = _enter(slot_keys, slot_values, *new[:4])
        positions = jnp.zeros((0,), jnp.int32)
    else:
        index = length % ring  # holds token length − W, which now leaves the window
        slot_keys, slot_values = _enter(slot_keys, slot_values,
                                        *(x[:, index] for x in ring_arrays[:4]))
        ring_arrays = [x.at[:, index].set(n) for x, n in zip(ring_arrays, new, strict=True)]
        positions = length - (length - jnp.arange(ring)) % ring  # ring entries: ≤ length
    visible = positions[None, :] >= state.document_start[:, None]  # [B, W]
    slots_visible = length - ring >= state.document_start  # [B]
    group = q.shape[1] // k.shape[1]
    heads = [_repeat_heads(x, group, axis=1) for x in (slot_keys, slot_values)]
    window_keys, values = (_repeat_heads(x, group) for x in (ring_arrays[4], ring_arrays[1]))
    slot_logits = scale * jnp.einsum("bhkm,bhk->bhm", heads[0], q.astype(dtype))
    window_logits = scale * jnp.einsum("bjhd,bhd->bhj", window_keys, q_window.astype(dtype))
    out = _attend(slot_logits, heads[1], window_logits, values, visible[:, None, :],
                  slots_visible[:, None, None], empty_slots)
    new_state = NHAState(slot_keys, slot_values, *ring_arrays, length + 1, state.document_start)
    return out.astype(q.dtype), _like(new_state, state)


def nha_empty_state(
    batch: int,
    num_kv_heads: int,
    key_dim: int,
    value_dim: int,
    num_slots: int,
    window: int,
    *,
    window_key_dim: int | None = None,
    dtype=jnp.float32,
    ring_dtype=None,
) -> NHAState:
    """The `NHAState` of an empty sequence: zero slots, an empty ring of `window` tokens.

    `ring_dtype` (default `dtype`) stores the ring's keys and values (e.g. the model's compute
    dtype); slots, s and g use `dtype`.
    """
    op = "nha_empty_state"
    for name, size in dict(batch=batch, num_kv_heads=num_kv_heads, key_dim=key_dim,
                           value_dim=value_dim, num_slots=num_slots).items():
        check_count(op, name, size, 1)
    check_count(op, "window", window, 0)
    check_count(op, "window_key_dim", window_key_dim, 1, optional=True)
    ring_dtype = dtype if ring_dtype is None else ring_dtype
    b, g, w, m = batch, num_kv_heads, window, num_slots
    return NHAState(
        slot_keys=jnp.zeros((b, g, key_dim, m), dtype),
        slot_values=jnp.zeros((b, g, m, value_dim), dtype),
        keys=jnp.zeros((b, w, g, key_dim), ring_dtype),
        values=jnp.zeros((b, w, g, value_dim), ring_dtype),
        s=jnp.zeros((b, w, g, m), dtype),
        g=jnp.zeros((b, w, g, m), dtype),
        window_keys=jnp.zeros((b, w, g, window_key_dim or key_dim), ring_dtype),
        length=jnp.zeros((), jnp.int32),
        document_start=jnp.zeros((b,), jnp.int32),
    )


def nha_slot_stream(
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    window: int,
    segment_ids: jax.Array | None = None,
    initial_state: NHAState | None = None,
) -> NHASlotStream:
    """The slot inputs entering at each step (token t − w at step t; the initial state's ring
    first, else zeros), document resets applied, and where the slots hold a token of t's
    document. Shapes as in `native_hybrid_attention`; arrays in float32 (float64 stays)."""
    op = "nha_slot_stream"
    sizes = check_dims(op, {}, k=(k, "BTGK"), v=(v, "BTGV"), s=(s, "BTGM"), g=(g, "BTGM"))
    check_floating(op, k=k, v=v, s=s, g=g)
    _check_window_and_documents(op, sizes, window, segment_ids, initial_state)
    dtype = compute_dtype(k, v, s, g)
    tokens = _tokens(k, v, s, g, k, segment_ids, initial_state, window, dtype)
    num_steps = k.shape[1]
    return NHASlotStream(*(x[:, :num_steps] for x in tokens[:4]),
                         slots_visible=_slots_visible(tokens, num_steps, window))


def nha_chunk_states(
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    chunk_size: int,
    initial_state: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The slot state `(K̃ [B, NC, G, K, M], Ṽ [B, NC, G, M, V])` entering each chunk of C
    steps, for slot inputs that enter one per step (e.g. an `NHASlotStream`'s k, v, s, g)."""
    op = "nha_chunk_states"
    state = (None, None) if initial_state is None else initial_state
    arrays = dict(k=(k, "BTGK"), v=(v, "BTGV"), s=(s, "BTGM"), g=(g, "BTGM"),
                  slot_keys=(state[0], "BGKM"), slot_values=(state[1], "BGMV"))
    arrays = {name: pair for name, pair in arrays.items() if pair[0] is not None}
    check_dims(op, {}, **arrays)
    check_floating(op, **{name: x for name, (x, _) in arrays.items()})
    _check_chunk_size(op, chunk_size)
    dtype = compute_dtype(k, v, s, g)
    k, v, s, g = (to_chunks(x.astype(dtype), chunk_size) for x in (k, v, s, g))  # [B,NC,C,G,.]
    log_decay = jnp.cumsum(g, axis=2)
    exit_writes = s * jnp.exp(log_decay[:, :, -1:] - log_decay)  # s_j·e^{G_C − G_j}
    chunk_decay = jnp.exp(log_decay[:, :, -1])  # [B, NC, G, M]
    key_increment = jnp.einsum("bncgk,bncgm->bngkm", k, exit_writes)
    value_increment = jnp.einsum("bncgm,bncgv->bngmv", exit_writes, v)
    keys, _ = chunk_state_scan(chunk_decay[..., None, :], key_increment, state[0])
    values, _ = chunk_state_scan(chunk_decay[..., :, None], value_increment, state[1])
    return keys, values


# --- shared pieces ---------------------------------------------------------------------------


class _Tokens(NamedTuple):
    """The ring (oldest first) then the call's tokens, `[B, W + T, ...]`: index i holds the token
    at call position j = i − W (j < 0: before the call). Compute dtype, G heads."""

    keys: jax.Array
    values: jax.Array
    s: jax.Array
    g: jax.Array  # RESET_LOG_DECAY at document starts
    window_keys: jax.Array
    visible: jax.Array  # [B, W + T] bool: belongs to the state's current document or the call
    document: jax.Array  # [B, W + T] int32: document index, 0 the state's


def _tokens(k, v, s, g, k_window, segment_ids, state, ring, dtype) -> _Tokens:
    batch, num_steps = k.shape[:2]
    starts = document_starts(_OP, segment_ids, batch, num_steps)
    starts = jnp.zeros((batch, num_steps), bool) if starts is None else starts
    g = reset_log_decay(g.astype(dtype), starts)
    call = (k, v, s, g, k_window)
    if state is None:
        length, document_start = jnp.zeros((), jnp.int32), jnp.zeros((batch,), jnp.int32)
        past = [jnp.zeros((batch, ring) + x.shape[2:], dtype) for x in call]
    else:
        length, document_start = state.length, state.document_start
        oldest_first = (length + jnp.arange(ring)) % max(ring, 1)
        past = [jnp.take(x, oldest_first, axis=1)
                for x in (state.keys, state.values, state.s, state.g, state.window_keys)]
    arrays = [jnp.concatenate([p.astype(dtype), x.astype(dtype)], axis=1)
              for p, x in zip(past, call, strict=True)]
    past_positions = length - ring + jnp.arange(ring)
    visible = jnp.concatenate([past_positions[None, :] >= document_start[:, None],
                               jnp.ones((batch, num_steps), bool)], axis=1)
    document = jnp.concatenate([jnp.zeros((batch, ring), jnp.int32),
                                jnp.cumsum(starts, axis=1, dtype=jnp.int32)], axis=1)
    return _Tokens(*arrays, visible, document)


def _slots_visible(tokens: _Tokens, num_steps: int, ring: int) -> jax.Array:
    """`[B, T]`: at step t the newest slot token is t − W (index t of `tokens`); the slots count
    only when it is visible and of t's document."""
    return tokens.visible[:, :num_steps] & (
        tokens.document[:, :num_steps] == tokens.document[:, ring:])


def _initial_slots(tokens, state, q, v):
    if state is not None:
        return tuple(x.astype(tokens.keys.dtype) for x in (state.slot_keys, state.slot_values))
    batch, kv_heads, key_dim = tokens.keys.shape[0], tokens.keys.shape[2], q.shape[3]
    slots = tokens.s.shape[3]
    return (jnp.zeros((batch, kv_heads, key_dim, slots), tokens.keys.dtype),
            jnp.zeros((batch, kv_heads, slots, v.shape[3]), tokens.keys.dtype))


def _final_state(tokens, slot_keys, slot_values, segment_ids, state, window, num_steps):
    """The state after the call: the last `window` tokens go to the ring (token p at p % W)."""
    last = [x[:, num_steps:] for x in tokens[:5]]  # oldest first, ring or fewer tokens
    last = [jnp.pad(x, [(0, 0), (window - x.shape[1], 0)] + [(0, 0)] * (x.ndim - 2))
            for x in last]
    length = jnp.zeros((), jnp.int32) if state is None else state.length
    document_start = (jnp.zeros((slot_keys.shape[0],), jnp.int32) if state is None
                      else state.document_start)
    if segment_ids is not None:
        steps = jnp.arange(num_steps)
        starts = document_starts(_OP, segment_ids, *segment_ids.shape)
        latest = jnp.max(jnp.where(starts, steps, -1), axis=1)
        document_start = jnp.where(latest >= 0, length + latest, document_start)
    new_length = length + num_steps
    by_position = (jnp.arange(window) - new_length) % max(window, 1)
    ring = [jnp.take(x, by_position, axis=1) for x in last]
    final = NHAState(slot_keys, slot_values, *ring, new_length.astype(jnp.int32),
                     document_start.astype(jnp.int32))
    return final if state is None else _like(final, state)


def _like(new: NHAState, old: NHAState) -> NHAState:
    return NHAState(*(n.astype(o.dtype) for n, o in zip(new, old, strict=True)))


def _repeat_heads(x, group: int, axis: int = 2):
    """Each kv head repeated for the `group` query heads that share it (a pytree of arrays with
    heads at `axis`; masks without a head axis pass through)."""
    if group == 1:
        return x
    return jax.tree.map(lambda a: jnp.repeat(a, group, axis=axis) if a.ndim > 2 else a, x)


def _enter(slot_keys, slot_values, k, v, s, g):
    """One token enters the slots (the GSA recurrence); heads before features."""
    forget = jnp.exp(g)
    slot_keys = slot_keys * forget[..., None, :] + k[..., :, None] * s[..., None, :]
    slot_values = forget[..., :, None] * slot_values + s[..., :, None] * v[..., None, :]
    return slot_keys, slot_values


def _empty_slot_logits(slot_logits, slots_visible, empty_slots):
    """Slot logits and their softmax mask when the slots hold nothing of the query's document:
    left out ("mask"), or M zero-value sinks with logit 0 ("sink")."""
    if empty_slots == "sink":
        return jnp.where(slots_visible, slot_logits, 0.0), jnp.ones_like(slots_visible)
    return slot_logits, slots_visible


def _attend(slot_logits, slot_values, window_logits, window_values, window_mask, slots_visible,
            empty_slots):
    """One softmax over `[slots ; window]` for one step. slot_logits `[B, H, M]`, slot_values
    `[B, H, M, V]`, window_logits `[B, H, J]`, window_values `[B, J, H, V]`, masks broadcast
    (window `[B, 1, J]`, slots `[B, 1, 1]`)."""
    slot_logits, slot_mask = _empty_slot_logits(slot_logits, slots_visible, empty_slots)
    num_slots = slot_logits.shape[-1]
    mask = jnp.concatenate([jnp.broadcast_to(slot_mask, slot_logits.shape[:-2] + (1, num_slots)),
                            window_mask], axis=-1)
    probs = masked_softmax(jnp.concatenate([slot_logits, window_logits], axis=-1), mask)
    slot_probs = jnp.where(slots_visible, probs[..., :num_slots], 0.0)
    return (jnp.einsum("bhmv,bhm->bhv", slot_values, slot_probs)
            + jnp.einsum("bjhv,bhj->bhv", window_values, probs[..., num_slots:]))


# --- rungs ------------------------------------------------------------------------------------
# Every rung takes the compute-dtype queries `[B, T, H, .]`, the `_Tokens` and initial slots
# repeated to H heads, and `slots_visible` `[B, T]`; it returns `(o, K̃, Ṽ)` with H heads.


def nha_reference(q, q_window, tokens, slots_visible, slot_keys, slot_values, *, window, scale,
                  empty_slots, chunk_size, slots_idle, call=None):
    """The definition: per token (`lax.scan`), the token t − W enters the slots, then one
    softmax over the slots and every key masked to the window t−W+1..t of t's document."""
    del chunk_size, slots_idle, call
    num_steps = q.shape[1]
    key_positions = jnp.arange(tokens.keys.shape[1]) - window

    def step(slots, xs):
        t, q_t, q_window_t, k_in, v_in, s_in, g_in, visible_t, document_t = xs
        slots = _enter(*slots, k_in, v_in, s_in, g_in)
        in_window = (key_positions > t - window) & (key_positions <= t)
        mask = in_window & tokens.visible & (tokens.document == document_t[:, None])
        slot_logits = scale * jnp.einsum("bhkm,bhk->bhm", slots[0], q_t)
        window_logits = scale * jnp.einsum("bjhd,bhd->bhj", tokens.window_keys, q_window_t)
        out = _attend(slot_logits, slots[1], window_logits, tokens.values, mask[:, None, :],
                      visible_t[:, None, None], empty_slots)
        return slots, out

    time_major = [jnp.moveaxis(x, 1, 0) for x in (
        q, q_window, *(x[:, :num_steps] for x in tokens[:4]), slots_visible,
        tokens.document[:, window:])]
    (slot_keys, slot_values), out = varying_scan(
        step, (slot_keys, slot_values), (jnp.arange(num_steps), *time_major), tokens)
    return jnp.moveaxis(out, 0, 1), slot_keys, slot_values


def nha_xla(q, q_window, tokens, slots_visible, slot_keys, slot_values, *, window, scale,
            empty_slots, chunk_size, slots_idle, call=None):
    """Chunkwise parallel: slot logits (chunked GSA pass), banded window logits, one softmax,
    slot readout (chunked GSA pass) plus the band's values."""
    del call
    batch, num_steps, heads, _ = q.shape
    num_slots = tokens.s.shape[-1]
    stream = [x[:, :num_steps] for x in tokens[:4]]  # slot inputs entering at each step
    if slots_idle:  # no slot token is ever visible: skip both slot passes
        slot_logits = jnp.zeros((batch, num_steps, heads, num_slots), q.dtype)
    else:
        slot_logits, slot_keys = gsa_slot_logits(
            q, stream[0], stream[2], stream[3], scale=scale, initial_state=slot_keys,
            chunk_size=chunk_size, return_final_state=True)
    slot_logits, slot_mask = _empty_slot_logits(slot_logits, slots_visible[:, :, None, None],
                                                empty_slots)
    logits, masks = [slot_logits], [jnp.broadcast_to(slot_mask, (batch, num_steps, 1,
                                                                 num_slots))]
    if window:
        band = _Band(window, chunk_size, num_steps)
        band_logits, band_mask = band.logits(q_window, tokens, scale)
        logits.append(band_logits)
        masks.append(band_mask)
    probs = masked_softmax(jnp.concatenate(logits, axis=-1), jnp.concatenate(masks, axis=-1))
    out = jnp.zeros((batch, num_steps, heads, tokens.values.shape[-1]), q.dtype)
    if not slots_idle:
        slot_probs = jnp.where(slots_visible[:, :, None, None], probs[..., :num_slots], 0.0)
        out, slot_values = gsa_slot_readout(
            slot_probs, stream[1], stream[2], stream[3], initial_state=slot_values,
            chunk_size=chunk_size, return_final_state=True)
    if window:
        out += band.readout(probs[..., num_slots:], tokens.values)
    return out, slot_keys, slot_values


class _Band:
    """The banded window block of the chunked form.

    Keys are laid out in chunks of C so that query chunk c meets key chunks c .. c + nb − 1:
    index i of the padded key sequence holds call position i − (nb − 1)·C. The oldest ring token
    (position −W) is in no window and is dropped. Offset o of query row r and key column i is at
    distance `r − i + (nb − 1 − o)·C` before the query; the window keeps distances 0 .. W − 1.
    """

    def __init__(self, window: int, chunk_size: int, num_steps: int):
        self.window, self.chunk = window, chunk_size
        self.width = (window - 2 + chunk_size) // chunk_size + 1  # nb = ⌈(W − 1)/C⌉ + 1
        self.num_chunks = -(-num_steps // chunk_size)
        self.num_steps = num_steps
        rows, cols = np.arange(chunk_size)[:, None], np.arange(chunk_size)[None, :]
        distance = np.concatenate([rows - cols + (self.width - 1 - o) * chunk_size
                                   for o in range(self.width)], axis=1)
        self.in_window = (distance >= 0) & (distance < window)  # [C, nb·C]

    def _keys_layout(self, x: jax.Array) -> jax.Array:
        """`[B, W + T, ...]` tokens → `[B, NC + nb − 1, C, ...]` padded key chunks."""
        x = x[:, 1:]
        front = (self.width - 1) * self.chunk - (self.window - 1)
        back = self.num_chunks * self.chunk - self.num_steps
        x = jnp.pad(x, [(0, 0), (front, back)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(x.shape[0], -1, self.chunk, *x.shape[2:])

    def _gather(self, chunks: jax.Array) -> list[jax.Array]:
        """The key chunks of every query chunk, one `[B, NC, C, ...]` array per offset."""
        return [chunks[:, o:o + self.num_chunks] for o in range(self.width)]

    def _from_chunks(self, x: jax.Array) -> jax.Array:
        """`[B, NC, C, ...]` → `[B, T, ...]`."""
        return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :self.num_steps]

    def logits(self, q_window, tokens, scale):
        """Band logits `[B, T, H, nb·C]` and their mask `[B, T, 1, nb·C]`."""
        queries = to_chunks(q_window, self.chunk)  # [B, NC, C, H, D]
        keys = self._gather(self._keys_layout(tokens.window_keys))
        logits = jnp.concatenate([jnp.einsum("bnrhd,bnihd->bnrhi", queries, k) for k in keys],
                                 axis=-1)
        visible = jnp.concatenate(self._gather(self._keys_layout(tokens.visible)), axis=-1)
        documents = jnp.concatenate(self._gather(self._keys_layout(tokens.document)), axis=-1)
        query_documents = to_chunks(tokens.document[:, self.window:], self.chunk)  # [B, NC, C]
        mask = (self.in_window & visible[:, :, None, :]
                & (documents[:, :, None, :] == query_documents[..., None]))
        return (self._from_chunks(scale * logits), self._from_chunks(mask[:, :, :, None, :]))

    def readout(self, probs, values):
        """`Σ_j p_j v_j` over the band: probs `[B, T, H, nb·C]`, values `[B, W + T, H, V]`."""
        probs = to_chunks(probs, self.chunk)
        c = self.chunk
        out = sum(jnp.einsum("bnrhi,bnihv->bnrhv", probs[..., o * c:(o + 1) * c], v)
                  for o, v in enumerate(self._gather(self._keys_layout(values))))
        return self._from_chunks(out)


class _Call(NamedTuple):
    """The call's own inputs (the pallas rung takes them as given: dtype, kv heads)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    s: jax.Array
    g: jax.Array
    q_window: jax.Array
    k_window: jax.Array
    tokens: _Tokens  # kv heads, compute dtype
    segment_ids: jax.Array | None
    state: NHAState | None
    final: bool  # the final state is wanted


def _kernel_context(call: _Call) -> dict:
    """The kernels' `documents` and `initial_state` for this call (None for a call without
    segment ids and state). The kernels' documents: ring tokens before the state's document
    get an id of their own (-1); a token whose gate is `RESET_LOG_DECAY` in every slot of
    every kv head starts a document (segment starts, and the resets a context-parallel shard
    or the state's ring carries)."""
    if call.segment_ids is None and call.state is None:
        return dict(documents=None, initial_state=None)
    tokens = call.tokens
    ring = 0 if call.state is None else call.state.keys.shape[1]
    first = tokens.keys.shape[1] - call.q.shape[1] - ring  # ring entries the kernels do not take
    ids = jnp.where(tokens.visible, tokens.document, -1)[:, first:]
    starts = jnp.all(tokens.g <= RESET_LOG_DECAY, axis=(2, 3))[:, first:]
    documents = pallas_nha.Documents(ids, starts)
    if call.state is None:
        return dict(documents=documents, initial_state=None)
    ring_inputs = [x[:, :ring].astype(like.dtype) for x, like in zip(
        tokens[:5], (call.k, call.v, call.s, call.g, call.k_window), strict=True)]
    state = pallas_nha.State(call.state.slot_keys, call.state.slot_values, *ring_inputs)
    return dict(documents=documents, initial_state=state)


_STATE_LAYOUTS = pallas_nha.State("BGKM", "BGMV", "BWGK", "BWGV", "BWGM", "BWGM", "BWGD")


def nha_pallas(q, q_window, tokens, slots_visible, slot_keys, slot_values, *, window, scale,
               empty_slots, chunk_size, slots_idle, call):
    """The Pallas kernels on the call's inputs (kv heads, dtypes as given), on each device's
    batch and heads; without a final state wanted, the slot states passed in are returned
    untouched."""
    del q, q_window, tokens, slots_visible, chunk_size, slots_idle

    def kernel(q, k, v, s, g, q_window, k_window, documents, initial_state):
        return pallas_nha.native_hybrid_attention(
            q, k, v, s, g, window=window, scale=scale, q_window=q_window, k_window=k_window,
            empty_slots=empty_slots, return_final_state=call.final, documents=documents,
            initial_state=initial_state)

    context = _kernel_context(call)
    result = shard_kernel(
        _OP, kernel, (call.q, call.k, call.v, call.s, call.g, call.q_window, call.k_window,
                      context["documents"], context["initial_state"]),
        ("BTHK", "BTGK", "BTGV", "BTGM", "BTGM", "BTHD", "BTGD", "BT", _STATE_LAYOUTS),
        ("BTHV", ("BGKM", "BGMV")) if call.final else "BTHV")
    if not call.final:
        return result, slot_keys, slot_values
    out, finals = result
    group = call.q.shape[2] // call.k.shape[2]
    return (out, *(_repeat_heads(x, group, axis=1).astype(slot_keys.dtype) for x in finals))


def _pallas_unsupported(*args, window, empty_slots, call, **kwargs) -> str | None:
    return pallas_nha.unsupported(call.q, call.k, call.v, call.s, call.g, window=window,
                                  q_window=call.q_window, k_window=call.k_window,
                                  empty_slots=empty_slots, **_kernel_context(call))


def nha_as_attention(q, q_window, tokens, slots_visible, slot_keys, slot_values, *, window,
                     scale, empty_slots, chunk_size, slots_idle, call):
    """Idle slots with empty ones masked (w ≥ T without a state: nha-hybrid's full-window
    layers): no slot ever enters the softmax, so the op is causal attention of the window
    branch within each document (`window_attention_inputs`), run by `ops.attention`'s fastest
    rung (cuDNN, or the flash kernel with segment ids, which visits only each document's
    blocks); the slot states pass through unchanged, as nothing enters them."""
    del q, q_window, tokens, slots_visible, window, empty_slots, chunk_size, slots_idle
    q, k, v, segment_ids = window_attention_inputs(call.q_window, call.k_window, call.v,
                                                   call.segment_ids)
    out = attention(q, k, v, causal=True, scale=scale, segment_ids=segment_ids)
    return out, slot_keys, slot_values


def window_attention_inputs(q_window, k_window, v, segment_ids):
    """The window branch as causal attention's inputs `q [B,T,H,D]`, `k [B,T,G,D]`,
    `v [B,T,G,V]`, segment ids `[B,T]` (or None) where the slots are idle: in the branch's own
    dtype (bf16 for the fast attention kernels, not the op's compute dtype, float32 at least
    for the slots' recurrent math), documents numbered as the op numbers them
    (`document_index`: an id that comes back is a new document)."""
    dtype = jnp.result_type(q_window, k_window, v)
    return (q_window.astype(dtype), k_window.astype(dtype), v.astype(dtype),
            None if segment_ids is None else document_index(segment_ids))


def _attention_applies(*args, slots_idle, empty_slots, **kwargs) -> bool:
    """Auto considers the "attention" rung for idle, masked slots on an accelerator (on a CPU
    both are XLA: the op's own chunked window keeps no [T, T] scores)."""
    return slots_idle and empty_slots == "mask" and backend() != "cpu"


def _attention_unsupported(*args, slots_idle, empty_slots, call, **kwargs) -> str | None:
    if not slots_idle:
        return "the slots take part (a window shorter than the call, or an initial state)"
    if empty_slots != "mask":
        return "empty slots are zero-value sinks in the softmax (empty_slots='sink')"
    if backend() == "cpu":
        return None
    # On an accelerator only where ops.attention takes a kernel: its XLA rung keeps the [T, T]
    # scores, where the NHA kernels' document-bounded window does not.
    q, k, v, segment_ids = jax.eval_shape(window_attention_inputs, call.q_window, call.k_window,
                                          call.v, call.segment_ids)
    rung = attention_rung(q, k, v, segment_ids=segment_ids)
    if rung == "xla":
        return (f"ops.attention would run its XLA rung ([T, T] scores) for "
                f"{jnp.dtype(q.dtype).name} head size {q.shape[-1]}")
    return None


_RUNGS = (
    # Idle slots (nha-hybrid's full-window layers) only, where it is chosen first: causal
    # attention's flash kernel against the NHA kernels' document-bounded window, nha-hybrid-340m
    # on packed WikiText-2 at T 8192, 130,332 → 138,356 tokens/s (BENCHMARKS.md, session 17).
    Rung("attention", nha_as_attention, _attention_unsupported, applies=_attention_applies),
    # Chosen automatically on GPUs only: the NHA kernels' TPU versions have run in TPU
    # interpret mode and compile for TPUs (pallas_kernels/nha/NOTES.md, "TPU lowering"), but
    # never ran on one; `implementation="pallas"` runs them there.
    Rung("pallas", nha_pallas, _pallas_unsupported, auto_platforms=("gpu",)),
    Rung("xla", nha_xla),
    Rung("reference", nha_reference, auto=False),
)


# --- validation -------------------------------------------------------------------------------


def _check_chunk_size(op: str, chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"{op}: chunk_size must be a power of two, got {chunk_size!r}")


def _check_state(op: str, state: NHAState, sizes: dict[str, int], ring: int) -> None:
    if not isinstance(state, NHAState):
        raise ValueError(f"{op}: the state must be an NHAState, got {type(state).__name__}")
    expected = {name: sizes[name] for name in "BGKVMD" if name in sizes}
    check_dims(op, {**expected, "W": ring}, slot_keys=(state.slot_keys, "BGKM"),
               slot_values=(state.slot_values, "BGMV"), keys=(state.keys, "BWGK"),
               values=(state.values, "BWGV"), s=(state.s, "BWGM"), g=(state.g, "BWGM"),
               window_keys=(state.window_keys, "BWGD"), document_start=(state.document_start,
                                                                        "B"))
    if jnp.shape(state.length) != ():
        raise ValueError(f"{op}: state.length must be a scalar, got shape "
                         f"{jnp.shape(state.length)}")
    # The new state takes the old one's dtypes: integer arrays would round what they store.
    check_floating(op, **state._replace(length=None, document_start=None)._asdict())
    check_integer(op, length=jnp.asarray(state.length), document_start=state.document_start)


def check_inputs(q, k, v, s, g, q_window, k_window, *, window, segment_ids, state, empty_slots,
                 chunk_size) -> None:
    """Refuses inputs `native_hybrid_attention` cannot take, naming what was expected and
    found."""
    sizes = check_dims(_OP, {}, q=(q, "BTHK"), k=(k, "BTGK"), v=(v, "BTGV"), s=(s, "BTGM"),
                       g=(g, "BTGM"), q_window=(q_window, "BTHD"), k_window=(k_window, "BTGD"))
    check_floating(_OP, q=q, k=k, v=v, s=s, g=g, q_window=q_window, k_window=k_window)
    check_divides(_OP, "num_kv_heads (axis 2 of k) must divide num_heads (axis 2 of q)",
                  sizes["G"], sizes["H"])
    check_choice(_OP, "empty_slots", empty_slots, EMPTY_SLOTS)
    _check_chunk_size(_OP, chunk_size)
    _check_window_and_documents(_OP, sizes, window, segment_ids, state)


def _check_window_and_documents(op, sizes, window, segment_ids, state) -> None:
    check_count(op, "window", window, 0)
    document_starts(op, segment_ids, sizes["B"], sizes["T"])  # checks shape and dtype
    if state is not None:
        try:
            _check_state(op, state, sizes, window)
        except ValueError as e:
            if "axis W" in str(e):
                raise ValueError(f"{op}: the initial state's ring holds "
                                 f"{state.keys.shape[1]} tokens, window={window}; they must be "
                                 "equal") from None
            raise
