"""Context-parallel forms of the linear recurrences: the same calls and results as the ops.

Every shard runs the op's own rung (chunked XLA, kernel) twice on its time shard:

1. from a zero entering state, keeping only the final state: the offset `U` of the shard's
   affine map `h_out = M·h_in + U`. `M` is the shard's decay product (diagonal decays: SSD,
   Mamba-1, DSS, GSA slots) or a dense K×K matrix (the gated delta rule: the op run on the
   identity state with zero values).
2. `incoming_states` combines the maps across the `seq` axis (float32; complex for DSS) into
   the true state entering each shard, and the op runs again from it: the shard's outputs,
   and the final state of the sequence from the last shard.

Pass 1 keeps only states (its outputs are dead code), so the extra work is the state pass of a
chunked form. Gradients flow through the same structure (the collectives transpose to their
reverse). Without a `seq` mesh axis of size > 1 every function here is the op itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hybrid_jax.ops import scan as scan_op
from hybrid_jax.ops.context_parallel.collectives import (
    DEFAULT_COMBINE,
    SEQ_AXIS,
    dense,
    diagonal,
    from_last_shard,
    halo,
    incoming_states,
    seq_shards,
    shard_over_seq,
    varying,
)
from hybrid_jax.ops.delta_rule import gated_delta_rule as _gated_delta_rule
from hybrid_jax.ops.dss import dss as _dss
from hybrid_jax.ops.gsa import gated_slot_attention as _gated_slot_attention
from hybrid_jax.ops.scan import compute_dtype
from hybrid_jax.ops.selective_scan import selective_scan as _selective_scan
from hybrid_jax.ops.ssd import ssd as _ssd

Run = Callable[[Any, Any, Any, Any], tuple[Any, Any]]


def sharded_recurrence(run: Run, transition: Callable[[Any, Any], Any], seq_args: Any,
                       params: Any, initial_state: Any, zero_state: Callable[[], Any], *,
                       segment_ids: jax.Array | None = None, apply=diagonal,
                       return_final_state: bool, axis_name: str, combine: str) -> Any:
    """`run(seq_args, params, h_in, segment_ids) -> (y, h_out)` over the whole sequence, split
    over shards when the mesh has a `seq` axis > 1 (else simply run from `initial_state`).

    `transition(seq_args, params)` is a shard's map M (applied to states by `apply`);
    `zero_state()` the zero state before the sequence (its dtypes are the map chain's).
    `segment_ids` `[B, T]` follow `hybrid_jax.ops.segments`: a shard holding a document start
    has the map M = 0 (its leaving state does not depend on its entering one), and a shard
    whose first token starts a document enters from the zero state.
    """
    if seq_shards(axis_name) == 1:
        y, final = run(seq_args, params, initial_state, segment_ids)
        return (y, final) if return_final_state else y
    zeros = zero_state()
    h0 = zeros if initial_state is None else jax.tree.map(lambda z, h: h.astype(z.dtype), zeros,
                                                          initial_state)

    def local(seq, replicated):
        seq, ids = seq
        params, h0 = replicated
        _, offset = run(seq, params, varying(jax.tree.map(jnp.zeros_like, h0), axis_name), ids)
        maps = transition(seq, params)
        if ids is not None:
            first = jax.lax.axis_index(axis_name) > 0
            boundary_B = first & (ids[:, 0] != halo(ids, 1, axis_name)[:, 0])
            reset_B = boundary_B | jnp.any(ids[:, 1:] != ids[:, :-1], axis=1)
            maps = _zero_rows(maps, reset_B)
        h_in = incoming_states(maps, offset, h0, apply=apply, axis_name=axis_name,
                               combine=combine)
        if ids is not None:
            h_in = _zero_rows(h_in, boundary_B)
        y, final = run(seq, params, h_in, ids)
        return y, (from_last_shard(final, axis_name) if return_final_state else None)

    y, final = shard_over_seq(local, (seq_args, segment_ids), (params, h0),
                              out_seq=(True, False), axis_name=axis_name)
    return (y, final) if return_final_state else y


def _zero_rows(tree: Any, rows_B: jax.Array) -> Any:
    """Every `[B, ...]` leaf of `tree` zeroed in the batch rows where `rows_B` is True."""
    return jax.tree.map(
        lambda x: jnp.where(rows_B.reshape((-1,) + (1,) * (x.ndim - 1)), jnp.zeros_like(x), x),
        tree)


def _cp_kwargs(axis_name, combine):
    return dict(axis_name=axis_name, combine=combine)


def _zeros(shape, dtype):
    return lambda: jnp.zeros(shape, dtype)


def ssd(x, dt, A, B, C, *, chunk_size=64, initial_state=None, return_final_state=False,
        segment_ids=None, D=None, implementation=None, axis_name=SEQ_AXIS,
        combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.ssd`, context-parallel over `axis_name` (state `[B, H, P, N]`)."""
    op = functools.partial(_ssd, chunk_size=chunk_size, implementation=implementation)
    dtype = compute_dtype(x, dt, A, B, C)

    def run(seq, params, h, ids):
        x, dt, B, C = seq
        A, D = params
        return op(x, dt, A, B, C, initial_state=h, return_final_state=True, segment_ids=ids,
                  D=D)

    def transition(seq, params):  # exp(Σ_t dt_t·A) per head: [B, H, 1, 1]
        A = params[0]
        return jnp.exp(jnp.sum(seq[1].astype(dtype), axis=1) * A.astype(dtype))[..., None, None]

    return sharded_recurrence(
        run, transition, (x, dt, B, C), (A, D), initial_state,
        _zeros((x.shape[0], x.shape[2], x.shape[3], B.shape[3]), dtype), segment_ids=segment_ids,
        return_final_state=return_final_state, **_cp_kwargs(axis_name, combine))


def selective_scan(x, dt, A, B, C, *, chunk_size=64, initial_state=None,
                   return_final_state=False, segment_ids=None, implementation=None,
                   axis_name=SEQ_AXIS, combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.selective_scan.selective_scan`, context-parallel (state `[B,H,P,N]`)."""
    op = functools.partial(_selective_scan, chunk_size=chunk_size, implementation=implementation)
    dtype = compute_dtype(x, dt, A, B, C)

    def run(seq, A, h, ids):
        x, dt, B, C = seq
        return op(x, dt, A, B, C, initial_state=h, return_final_state=True, segment_ids=ids)

    def transition(seq, A):  # exp(Σ_t dt_t·A) per (head, channel, state): [B, H, P, N]
        return jnp.exp(jnp.sum(seq[1].astype(dtype), axis=1)[..., None] * A.astype(dtype))

    return sharded_recurrence(run, transition, (x, dt, B, C), A, initial_state,
                              _zeros(x.shape[:1] + A.shape, dtype), segment_ids=segment_ids,
                              return_final_state=return_final_state,
                              **_cp_kwargs(axis_name, combine))


def dss(u, log_decay, coeff, *, initial_state=None, return_final_state=False,
        segment_ids=None, chunk_size=64, implementation=None, axis_name=SEQ_AXIS,
        combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.dss`, context-parallel (complex state `[B, H, N]`)."""
    dtype = jnp.promote_types(compute_dtype(u, log_decay, coeff), jnp.complex64)
    state_shape = u.shape[:1] + log_decay.shape

    def run(u, params, h, ids):
        return _dss(u, *params, initial_state=h, return_final_state=True, segment_ids=ids,
                    chunk_size=chunk_size, implementation=implementation)

    def transition(u, params):  # exp(λΔ·T_shard), the same for every batch row
        return jnp.broadcast_to(jnp.exp(u.shape[1] * params[0].astype(dtype)), state_shape)

    return sharded_recurrence(run, transition, u, (log_decay, coeff), initial_state,
                              _zeros(state_shape, dtype), segment_ids=segment_ids,
                              return_final_state=return_final_state,
                              **_cp_kwargs(axis_name, combine))


def linear_scan(a, b, initial_state=None, *, axis_name=SEQ_AXIS, combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.scan.linear_scan` along axis 1 (all states of `h_t = a_t·h_{t−1} + b_t`),
    context-parallel; `a` `[B, T, ...]` with the shape of `b`."""
    dtype = jnp.result_type(a, b)

    def run(seq, params, h, ids):
        states = scan_op.linear_scan(*seq, h, axis=1)
        return states, states[:, -1]

    def transition(seq, params):
        return jnp.prod(jnp.broadcast_to(seq[0], seq[1].shape).astype(dtype), axis=1)

    return sharded_recurrence(run, transition, (a, b), (), initial_state,
                              _zeros(b.shape[:1] + b.shape[2:], dtype), return_final_state=False,
                              **_cp_kwargs(axis_name, combine))


def gated_delta_rule(q, k, v, g, beta, *, scale=None, chunk_size=64, initial_state=None,
                     return_final_state=False, segment_ids=None, implementation=None,
                     axis_name=SEQ_AXIS, combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.gated_delta_rule`, context-parallel (state `[B, H, K, V]`).

    A shard's map is the dense `M = Π_t e^{g_t}(I − β_t k_t k_tᵀ)` `[B, H, K, K]`: the op's
    final state from the identity with zero values.
    """
    op = functools.partial(_gated_delta_rule, scale=scale, chunk_size=chunk_size,
                           implementation=implementation)
    dtype = compute_dtype(q, k, v, g, beta)
    batch, _, heads, key_dim = k.shape

    def run(seq, params, h, ids):
        return op(*seq, initial_state=h, return_final_state=True, segment_ids=ids)

    def transition(seq, params):
        q, k, v, g, beta = seq
        identity = varying(jnp.broadcast_to(jnp.eye(key_dim, dtype=dtype),
                                            (batch, heads, key_dim, key_dim)), axis_name)
        return op(q, k, jnp.zeros_like(k), g, beta, initial_state=identity,
                  return_final_state=True)[1]

    return sharded_recurrence(run, transition, (q, k, v, g, beta), (), initial_state,
                              _zeros((batch, heads, key_dim, v.shape[3]), dtype), apply=dense,
                              segment_ids=segment_ids,
                              return_final_state=return_final_state,
                              **_cp_kwargs(axis_name, combine))


def gated_slot_attention(q, k, v, s, g, *, scale=None, chunk_size=64, initial_state=None,
                         return_final_state=False, segment_ids=None, implementation=None,
                         axis_name=SEQ_AXIS, combine=DEFAULT_COMBINE):
    """`hybrid_jax.ops.gated_slot_attention`, context-parallel (state `(K̃ [B,H,K,M],
    Ṽ [B,H,M,V])`); a shard's map is the slot decay product `e^{Σ g}` on the slot axis."""
    dtype = compute_dtype(q, k, v, s, g)

    def run(seq, params, h, ids):
        return _gated_slot_attention(*seq, scale=scale, chunk_size=chunk_size,
                                     initial_state=None if h is None else tuple(h),
                                     return_final_state=True, segment_ids=ids,
                                     implementation=implementation)

    def zero_state():
        batch, _, heads, key_dim = k.shape
        return (jnp.zeros((batch, heads, key_dim, s.shape[3]), dtype),
                jnp.zeros((batch, heads, s.shape[3], v.shape[3]), dtype))

    return sharded_recurrence(run, lambda seq, params: slot_decay(seq[4], dtype),
                              (q, k, v, s, g), (), initial_state, zero_state,
                              segment_ids=segment_ids, return_final_state=return_final_state,
                              **_cp_kwargs(axis_name, combine))


def slot_decay(g: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """A shard's map of the slot state from its log gates `g` `[B, T, H, M]`: `e^{Σ_t g_t}` on
    the slot axis of K̃ `[B, H, 1, M]` and of Ṽ `[B, H, M, 1]`."""
    decay = jnp.exp(jnp.sum(g.astype(dtype), axis=1))
    return decay[:, :, None, :], decay[..., None]
