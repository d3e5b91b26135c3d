"""The collectives of context parallelism over the `seq` mesh axis (inside `jax.shard_map`).

* `shard_over_seq` runs a function on each device's time shard, manual over the `seq` axis
  only (the other mesh axes stay automatic, so batch and head sharding pass through).
* `incoming_states` combines per-shard affine maps `h_out = M·h_in + U` into the state entering
  every shard: an `all_gather` of the maps and a D-step fold, or a log₂(D)-step `ppermute`
  prefix scan (Hillis–Steele over the maps shifted by one device).
* `halo` gives each shard the last tokens of the shards before it (short convolutions,
  sliding windows), by `ppermute` of whole shards.
* `from_last_shard` makes the last shard's value (e.g. a final state) the result of every shard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_kernels.vma import varying_over

SEQ_AXIS = "seq"
COMBINES = ("all_gather", "ppermute")
DEFAULT_COMBINE = "ppermute"
"""Measured on fake CPU devices (experiments/benchmarks/context_parallel_combine.py, BENCHMARKS.md):
fwd+bwd, the ppermute scan takes 0.38–0.55× the all-gather fold's time on 8 shards and
0.65–0.9× on 4; the all-gather is faster on 2 (one exchange either way)."""


def seq_shards(axis_name: str = SEQ_AXIS) -> int:
    """How many devices split time under the current mesh: 1 without a mesh, without a
    `axis_name` axis, or inside a `shard_map` that is already manual over it."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or axis_name not in mesh.axis_names or axis_name in mesh.manual_axes:
        return 1
    return mesh.shape[axis_name]


def shard_over_seq(fn: Callable[..., Any], seq_args: Any, replicated_args: Any, *,
                   out_seq: Any, axis_name: str = SEQ_AXIS) -> Any:
    """`fn(seq_args, replicated_args)` on every time shard.

    `seq_args`: a pytree of `[B, T, ...]` arrays split along time; `replicated_args`: a pytree
    every shard sees whole. `out_seq` is a pytree prefix of the output with True where the
    output is split along time (axis 1) and False where every shard returns the same value.
    """
    shards = seq_shards(axis_name)
    shapes = [x.shape for x in jax.tree.leaves(seq_args)]
    if len({shape[1:2] for shape in shapes}) > 1:  # shards would see other lengths (or none)
        raise ValueError(f"context parallelism over {shards} '{axis_name}' devices needs one "
                         f"time length (axis 1) for every sequence input, got shapes {shapes}")
    for shape in shapes:
        if shape[1] % shards:
            raise ValueError(f"context parallelism over {shards} '{axis_name}' devices needs a "
                             f"time axis divisible by {shards}, got shape {shape}")
    out_specs = jax.tree.map(lambda split: P(None, axis_name) if split else P(), out_seq)
    return jax.shard_map(fn, in_specs=(P(None, axis_name), P()), out_specs=out_specs,
                         axis_names={axis_name})(seq_args, replicated_args)


def varying(tree: Any, axis_name: str = SEQ_AXIS) -> Any:
    """Marks values as differing per shard (e.g. a zero state that a scan will carry)."""
    return jax.tree.map(lambda x: varying_over(x, (axis_name,)), tree)


def diagonal(m: jax.Array, h: jax.Array) -> jax.Array:
    """A diagonal map (decay product, broadcast over the state) applied to a state or a map."""
    return m * h


def dense(m: jax.Array, h: jax.Array) -> jax.Array:
    """A dense `[..., K, K]` map applied to a `[..., K, V]` state or another map."""
    return jnp.einsum("...ij,...jv->...iv", m, h)


def incoming_states(maps: Any, offsets: Any, initial_state: Any, *,
                    apply: Callable[[jax.Array, jax.Array], jax.Array],
                    axis_name: str = SEQ_AXIS, combine: str = DEFAULT_COMBINE) -> Any:
    """The state entering each shard: `h_0 = initial_state`, `h_{i+1} = M_i·h_i + U_i`.

    Args:
      maps: this shard's `M` (pytree; each leaf applied to the matching state leaf by `apply`).
      offsets: this shard's `U`, the state it leaves from a zero entering state.
      initial_state: the state before shard 0 (same for every shard).
      apply: `apply(M, h) = M·h` for one leaf; also composes two maps, `apply(M₂, M₁)`.
      combine: "all_gather" (gather every map, fold the ones before this shard) or
        "ppermute" (prefix scan in ⌈log₂ D⌉ neighbour exchanges).
    """
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    shards = jax.lax.axis_size(axis_name)
    index = jax.lax.axis_index(axis_name)
    if combine == "all_gather":
        all_maps, all_offsets = (jax.tree.map(lambda x: jax.lax.all_gather(x, axis_name), t)
                                 for t in (maps, offsets))
        state = varying(initial_state, axis_name)
        for j in range(shards - 1):
            state = jax.tree.map(
                lambda m, u, h, j=j: jnp.where(j < index, apply(m[j], h) + u[j], h),
                all_maps, all_offsets, state)
        return state
    # Shard i starts from shard i−1's map; shard 0 from the constant map to initial_state
    # (M = 0, U = h₀). An inclusive scan of these maps, applied to anything, is h_i.
    shift = [(i, i + 1) for i in range(shards - 1)]
    maps, offsets = (jax.tree.map(lambda x: jax.lax.ppermute(x, axis_name, shift), t)
                     for t in (maps, offsets))
    offsets = jax.tree.map(lambda u, h: jnp.where(index == 0, h, u), offsets, initial_state)
    step = 1
    while step < shards:
        perm = [(i, i + step) for i in range(shards - step)]
        earlier_maps, earlier_offsets = (
            jax.tree.map(lambda x, perm=perm: jax.lax.ppermute(x, axis_name, perm), t)
            for t in (maps, offsets))
        take = index >= step
        offsets = jax.tree.map(lambda m, u, ue, take=take: jnp.where(take, apply(m, ue) + u, u),
                               maps, offsets, earlier_offsets)
        maps = jax.tree.map(lambda m, me, take=take: jnp.where(take, apply(m, me), m), maps,
                            earlier_maps)
        step *= 2
    return offsets


def from_last_shard(tree: Any, axis_name: str = SEQ_AXIS) -> Any:
    """The last shard's value, returned on every shard (e.g. the final state of a sequence)."""
    last = jax.lax.axis_index(axis_name) == jax.lax.axis_size(axis_name) - 1
    return jax.tree.map(lambda x: jax.lax.psum(jnp.where(last, x, jnp.zeros_like(x)), axis_name),
                        tree)


def halo(x: jax.Array, width: int, axis_name: str = SEQ_AXIS) -> jax.Array:
    """The `width` tokens before this shard, `[B, width, ...]` (zeros before the sequence).

    `x` is this shard's `[B, T/D, ...]`; a halo wider than a shard takes whole shards from
    several predecessors (one `ppermute` each).
    """
    shards = jax.lax.axis_size(axis_name)
    local = x.shape[1]
    hops = min(-(-width // local), shards - 1)
    parts = [jax.lax.ppermute(x, axis_name, [(i, i + hop) for i in range(shards - hop)])
             for hop in range(hops, 0, -1)]
    missing = width - hops * local
    if missing > 0:  # further back than the first shard: zeros
        parts.insert(0, jnp.zeros((x.shape[0], missing) + x.shape[2:], x.dtype))
    joined = jnp.concatenate(parts, axis=1) if parts else x[:, :0]
    return joined[:, joined.shape[1] - width:]


def with_past(fn: Callable[..., jax.Array], width: int, seq_args: Any, replicated_args: Any = (),
              *, axis_name: str = SEQ_AXIS) -> jax.Array:
    """`fn(seq_args, replicated_args) -> [B, T, ...]` for a causal op that looks back at most
    `width` tokens (a short convolution), run on time shards that each see a halo of `width`
    tokens before them; without a `seq` axis > 1 simply `fn(seq_args, replicated_args)`."""
    if seq_shards(axis_name) == 1 or width == 0:
        return fn(seq_args, replicated_args)

    def local(seq, replicated):
        extended = jax.tree.map(lambda x: jnp.concatenate([halo(x, width, axis_name), x], 1), seq)
        return fn(extended, replicated)[:, width:]

    return shard_over_seq(local, seq_args, replicated_args, out_seq=True, axis_name=axis_name)
