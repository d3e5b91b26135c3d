"""Context-parallel native hybrid attention: each time shard continues from the exact NHA state
of the tokens before it.

A shard starting at token t₀ (of T/D) runs the op with `initial_state = NHAState` after t₀
tokens, built from collectives:

* the ring: the window inputs of tokens t₀−w .. t₀−1, a halo (`ppermute` of whole shards when
  w is wider than a shard), in ring order (token p at p % w);
* the slots: the slot inputs are the tokens shifted by w, so the shard's slot stream is tokens
  t₀−w .. t₀+T/D−1−w (halo first). Its affine map (decay product `e^{Σg}`, offset from empty
  slots) is combined across shards into the slots after token t₀−1−w;
* documents: segment ids are all-gathered (one int per token) to find where the document of
  token t₀−1 starts; a document start at t₀ itself gets its reset gate here, since the op
  treats its first token as continuing the state's document.

Idle slots (w ≥ T, empty ones masked) run no NHA state: the op is then causal attention of
the window branch, run by `attention.py`'s form, with `implementation="attention"`, and under
auto on an accelerator where that form trades time for heads onto a kernel rung (as the op's
own auto takes it only where `ops.attention` runs a kernel): its time shards run the XLA
rung's `[T/D, T]` scores, where the NHA rungs' document-bounded window keeps none.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from hybrid_jax.ops import dispatch
from hybrid_jax.ops.context_parallel.attention import attention, heads_for_time_unsupported
from hybrid_jax.ops.context_parallel.collectives import (
    DEFAULT_COMBINE,
    SEQ_AXIS,
    diagonal,
    halo,
    incoming_states,
    seq_shards,
    shard_over_seq,
)
from hybrid_jax.ops.context_parallel.recurrences import slot_decay
from hybrid_jax.ops.nha import NHAState, check_inputs, window_attention_inputs
from hybrid_jax.ops.nha import native_hybrid_attention as _native_hybrid_attention
from hybrid_jax.ops.scan import compute_dtype
from hybrid_jax.ops.segments import RESET_LOG_DECAY


def native_hybrid_attention(q, k, v, s, g, *, window, scale=None, q_window=None, k_window=None,
                            segment_ids=None, empty_slots="mask", chunk_size=64,
                            implementation=None, axis_name=SEQ_AXIS, combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.native_hybrid_attention` over a whole sequence (no `initial_state`),
    context-parallel over `axis_name`; shapes and result as the op."""
    op_kwargs = dict(window=window, scale=scale, empty_slots=empty_slots, chunk_size=chunk_size,
                     implementation=implementation)
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    shards = seq_shards(axis_name)
    if shards == 1:
        return _native_hybrid_attention(q, k, v, s, g, q_window=q_window, k_window=k_window,
                                       segment_ids=segment_ids, **op_kwargs)
    # The whole sequence's inputs checked as the op would (a shard's call sees parts of them).
    check_inputs(q, k, v, s, g, q_window, k_window, window=window, segment_ids=segment_ids,
                  state=None, empty_slots=empty_slots, chunk_size=chunk_size)
    if window >= q.shape[1] and empty_slots == "mask" and (
            implementation == "attention" or _auto_attention(
                q, q_window, k_window, v, segment_ids, implementation, axis_name)):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        q_window, k_window, v, documents = window_attention_inputs(q_window, k_window, v,
                                                                   segment_ids)
        return attention(q_window, k_window, v, causal=True, scale=scale, segment_ids=documents,
                         axis_name=axis_name).astype(q.dtype)
    dtype = compute_dtype(q, k, v, s, g, q_window, k_window)
    local_length = q.shape[1] // shards

    def local(seq, _):
        q, k, v, s, g, q_window, k_window, segment_ids = seq
        start = jax.lax.axis_index(axis_name) * local_length
        g = g.astype(dtype)
        if segment_ids is None:  # one document: the op gets no segment ids (kernels need none)
            document_start = jnp.zeros(q.shape[:1], jnp.int32)
        else:
            starts, document_start = _documents(segment_ids, start, axis_name)
            g = jnp.where(starts[:, :, None, None], RESET_LOG_DECAY, g)
        # The window's tokens before the shard, oldest first (zeros before the sequence).
        past = [halo(x.astype(dtype), window, axis_name) for x in (k, v, s, g, k_window)]
        stream = [jnp.concatenate([p, x.astype(dtype)], 1)[:, :local_length] if window
                  else x.astype(dtype) for p, x in zip(past[:4], (k, v, s, g), strict=True)]
        slot_keys, slot_values = incoming_states(
            slot_decay(stream[3], dtype), _slot_offsets(*stream), _slot_zeros(k, s, v, dtype),
            apply=diagonal, axis_name=axis_name, combine=combine)
        ring = [jnp.roll(x, start % window, axis=1) if window else x for x in past]
        state = NHAState(slot_keys, slot_values, *ring, length=start.astype(jnp.int32),
                         document_start=document_start.astype(jnp.int32))
        return _native_hybrid_attention(q, k, v, s, g, q_window=q_window, k_window=k_window,
                                       segment_ids=segment_ids, initial_state=state, **op_kwargs)

    seq = (q, k, v, s, g, q_window, k_window, segment_ids)
    return shard_over_seq(local, seq, (), out_seq=True, axis_name=axis_name)


def _auto_attention(q, q_window, k_window, v, segment_ids, implementation, axis_name) -> bool:
    """Whether auto runs idle slots as the window branch's causal attention (module docstring):
    on an accelerator, where that attention takes heads for time onto a kernel rung; otherwise
    (logged) the NHA rungs on time shards, whose document-bounded window keeps no [T, T]
    scores."""
    if implementation is not None or dispatch.backend() == "cpu":
        return False
    q_window, k_window, v, documents = jax.eval_shape(window_attention_inputs, q_window,
                                                      k_window, v, segment_ids)
    reason = heads_for_time_unsupported(q_window, k_window, v, segment_ids=documents,
                                        axis_name=axis_name)
    if reason is not None:
        shapes = tuple((x.shape, str(x.dtype)) for x in (q, q_window, k_window, v))
        dispatch.log_once(("context_parallel.native_hybrid_attention", shapes, reason),
                          logging.INFO, "context-parallel native_hybrid_attention: idle slots "
                          "(w ≥ T) run the NHA rungs on time shards for window queries %s, "
                          "not causal attention: %s", list(q_window.shape), reason)
    return reason is None


def _documents(segment_ids, start, axis_name):
    """This shard's document starts `[B, T/D]` (token 0 of the sequence is none) and where the
    document of the token before the shard starts `[B]` (the shard's start when its first token
    starts a document)."""
    everything = jax.lax.all_gather(segment_ids, axis_name, axis=1, tiled=True)  # [B, T]
    starts = jnp.pad(everything[:, 1:] != everything[:, :-1], ((0, 0), (1, 0)))
    positions = jnp.arange(everything.shape[1])
    latest = jnp.max(jnp.where(starts & (positions <= start), positions, 0), axis=1)
    local = jax.lax.dynamic_slice_in_dim(starts, start, segment_ids.shape[1], axis=1)
    return local, latest


def _slot_offsets(k, v, s, g):
    """The slots after the stream `k [B,T,G,K]`, `v [B,T,G,V]`, `s, g [B,T,G,M]` from empty
    slots: `K̃ = Σ_j k_j (s_j e^{Σ_{i>j} g_i})ᵀ`, `Ṽ = Σ_j (s_j e^{Σ_{i>j} g_i}) v_jᵀ`."""
    later = jnp.cumsum(g[:, ::-1], axis=1)[:, ::-1]  # Σ_{i≥j} g_i
    later = jnp.concatenate([later[:, 1:], jnp.zeros_like(later[:, :1])], axis=1)
    writes = s * jnp.exp(later)
    return (jnp.einsum("btgk,btgm->bgkm", k, writes), jnp.einsum("btgm,btgv->bgmv", writes, v))


def _slot_zeros(k, s, v, dtype):
    batch, _, heads, key_dim = k.shape
    slots = s.shape[3]
    return (jnp.zeros((batch, heads, key_dim, slots), dtype),
            jnp.zeros((batch, heads, slots, v.shape[3]), dtype))
