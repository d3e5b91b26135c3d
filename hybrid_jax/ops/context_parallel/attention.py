"""Context-parallel softmax attention: each time shard's queries against the keys they see.

Two forms. Where a kernel rung (flash / cuDNN) would run the whole sequence's attention and the
heads split over the `seq` devices, the shards trade time for heads (`all_to_all`, as
DeepSpeed-Ulysses): each device attends over the whole sequence for its share of the heads,
on the kernels (with the whole sequence's segment ids, all-gathered), then trades back. A
single key head (MQA, Oryx-mamba2's attention mode) is repeated to one a device, and values a
multiple of the head dim wide are split into heads first (`value_heads`). Otherwise (the XLA
rung, heads that do not split, non-causal bands), time stays split: full attention
all-gathers K/V (and their document ids) over the `seq` axis, and causal windowed attention
whose window reaches back less than the whole sequence takes only a halo of the `window − 1`
tokens before the shard (`ppermute` of whole shards, several when the window is wider than a
shard). Queries and keys attend by their positions in the whole sequence, and packed documents
by their segment ids on both sides, so a document may cross a shard boundary anywhere. (A ring
variant that streams K/V blocks instead of gathering them saves memory at long T; it is not
built.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_jax.ops.attention import attention as _attention
from hybrid_jax.ops.attention import (
    attention_rung,
    check_inputs,
    merge_value_heads,
    value_heads,
)
from hybrid_jax.ops.context_parallel.collectives import SEQ_AXIS, halo, seq_shards, shard_over_seq


def attention(q, k, v, *, causal=True, window=None, scale=None, segment_ids=None,
              q_positions=None, kv_positions=None, segment_extents=None, active_queries=None,
              implementation=None, axis_name=SEQ_AXIS):
    """`hybrid_jax.ops.attention`, context-parallel over `axis_name` for self-attention (the
    positions are then the sequence's own); shapes and result as the op. `segment_extents`
    (whole-sequence indices) serve the unsharded call and the heads-for-time form (gathered
    whole again); a time shard's keys come with their own segment ids."""
    op_kwargs = dict(causal=causal, window=window, scale=scale, implementation=implementation)
    shards = seq_shards(axis_name)
    if shards == 1:
        return _attention(q, k, v, segment_ids=segment_ids, q_positions=q_positions,
                          kv_positions=kv_positions, segment_extents=segment_extents,
                          active_queries=active_queries, **op_kwargs)
    # The whole sequence's inputs checked as the op would (a shard's call sees parts of them).
    check_inputs(q, k, v, window, segment_ids, q_positions, kv_positions, None, active_queries)
    if q_positions is not None or kv_positions is not None or q.shape[1] != k.shape[1]:
        raise ValueError(f"context-parallel attention over {shards} '{axis_name}' devices is "
                         "self-attention without explicit positions (a decode step runs "
                         f"without a '{axis_name}' axis); got q {q.shape}, k {k.shape}")
    unsupported = ("not causal" if not causal else heads_for_time_unsupported(
        q, k, v, window=window, segment_ids=segment_ids, active_queries=active_queries,
        implementation=implementation, axis_name=axis_name))
    if unsupported is None:
        return _head_split(q, k, v, shards, axis_name, window=window, scale=scale,
                           segment_ids=segment_ids, segment_extents=segment_extents,
                           active_queries=active_queries, implementation=implementation)
    if implementation in _KERNEL_RUNGS:  # a time shard's call has explicit positions
        raise ValueError(
            f"context-parallel attention: implementation={implementation!r} runs over {shards} "
            f"'{axis_name}' devices only as heads for time: causal attention whose heads and key "
            "heads (after value slices, one key head repeated to each device) split over the "
            f"devices; got causal={causal}, q {q.shape}, k {k.shape}, v {v.shape} "
            f"({unsupported})")
    local_length = q.shape[1] // shards
    use_halo = causal and window is not None and window - 1 < (shards - 1) * local_length

    def local(seq, _):
        q, k, v, segment_ids, active_queries = seq
        start = jax.lax.axis_index(axis_name) * local_length
        q_positions = start + jnp.arange(local_length)
        width = window - 1 if use_halo else 0
        kv_positions = (start - width + jnp.arange(width + local_length) if use_halo  # < 0: masked
                        else jnp.arange(k.shape[1] * shards))

        def gather(x):
            if x is None:  # no segment ids (one document per row): none are passed on
                return None
            if use_halo:
                return jnp.concatenate([halo(x, width, axis_name), x], 1)
            return jax.lax.all_gather(x, axis_name, axis=1, tiled=True)

        k_all, v_all, kv_segment_ids = (gather(x) for x in (k, v, segment_ids))
        return _attention(q, k_all, v_all, segment_ids=segment_ids,
                          kv_segment_ids=kv_segment_ids, q_positions=q_positions,
                          kv_positions=kv_positions, active_queries=active_queries, **op_kwargs)

    return shard_over_seq(local, (q, k, v, segment_ids, active_queries), (), out_seq=True,
                          axis_name=axis_name)


_KERNEL_RUNGS = ("cudnn", "pallas")


def heads_for_time_unsupported(q, k, v, *, window=None, segment_ids=None, active_queries=None,
                               implementation=None, axis_name=SEQ_AXIS) -> str | None:
    """Why causal `attention` of these whole-sequence inputs (arrays or ShapeDtypeStructs)
    over `axis_name`'s devices would not take the heads-for-time form (module docstring), or
    None where it will: the heads (after `value_heads`) or the key heads, repeated to one a
    device, must split over the devices, and a kernel rung must run the whole sequence at a
    device's share of the heads."""
    shards = seq_shards(axis_name)
    q, k, v = jax.eval_shape(value_heads, q, k, v)
    heads, kv_heads = q.shape[2], k.shape[2]
    repeat = _key_repeat(kv_heads, shards)
    if heads % shards or (kv_heads * repeat) % shards:
        return (f"heads {heads} and key heads {kv_heads} (after value slices) do not split over "
                f"{shards} '{axis_name}' devices")
    per_device = lambda x, n: jax.ShapeDtypeStruct((*x.shape[:2], n // shards, x.shape[3]),
                                                   x.dtype)
    rung = attention_rung(per_device(q, heads), per_device(k, kv_heads * repeat),
                          per_device(v, kv_heads * repeat), window=window,
                          segment_ids=segment_ids, active_queries=active_queries,
                          implementation=implementation)
    if rung not in _KERNEL_RUNGS:
        return f"ops.attention runs its {rung} rung for a device's {heads // shards} heads"
    return None


def _key_repeat(kv_heads: int, shards: int) -> int:
    """How often each key head is repeated: to one a device where there are fewer."""
    return shards // kv_heads if kv_heads < shards else 1


def _head_split(q, k, v, shards, axis_name, *, window, scale, segment_ids, segment_extents,
                active_queries, implementation):
    """Causal attention in the heads-for-time form (module docstring), where
    `heads_for_time_unsupported` says it applies."""
    groups, value_dim = k.shape[2], v.shape[-1]

    def local(seq, _):
        q, k, v, segment_ids, extents, active_queries = seq
        to_heads = lambda x: jax.lax.all_to_all(x, axis_name, 2, 1, tiled=True)
        whole = lambda tree: jax.tree.map(  # None (no ids, no flags) stays None
            lambda x: jax.lax.all_gather(x, axis_name, axis=1, tiled=True), tree)
        out = _attention(to_heads(q), to_heads(k), to_heads(v), causal=True, window=window,
                         scale=scale, segment_ids=whole(segment_ids),
                         segment_extents=whole(extents), active_queries=whole(active_queries),
                         implementation=implementation)
        return jax.lax.all_to_all(out, axis_name, 1, 2, tiled=True)

    q, k, v = value_heads(q, k, v)
    k, v = (jnp.repeat(x, _key_repeat(k.shape[2], shards), axis=2) for x in (k, v))
    out = shard_over_seq(local, (q, k, v, segment_ids, segment_extents, active_queries), (),
                         out_seq=True, axis_name=axis_name)
    return merge_value_heads(out, groups, value_dim)
