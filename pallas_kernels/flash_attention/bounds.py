"""Which key blocks a query block can see, and the reverse, from the segment ids (in XLA).

The kernels visit only the key blocks between these bounds, so attention over packed documents
and sliding windows costs the band they cover, not the full causal triangle. Segment ids need
not be contiguous: a document's extent is the span from its first to its last token (found by
one sort), so the bounds are exact for contiguous documents and never too tight for any id
pattern.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def segment_extents(segment_ids_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`first, last` `[B, T]` int32: the first and last index holding each token's id."""
    batch, length = segment_ids_BT.shape
    index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    ids, order = lax.sort((segment_ids_BT, index), dimension=1, num_keys=2)
    change = ids[:, 1:] != ids[:, :-1]
    edge = jnp.ones((batch, 1), bool)
    run_start = lax.cummax(jnp.where(jnp.concatenate([edge, change], 1), index, 0), axis=1)
    run_end = lax.cummin(jnp.where(jnp.concatenate([change, edge], 1), index, length - 1),
                         axis=1, reverse=True)
    rows = jnp.arange(batch)[:, None]
    inverse = jnp.zeros_like(order).at[rows, order].set(index)  # sorted position of each token
    first = jnp.take_along_axis(order, run_start, 1)
    last = jnp.take_along_axis(order, run_end, 1)
    return jnp.take_along_axis(first, inverse, 1), jnp.take_along_axis(last, inverse, 1)


def run_extents(segment_ids_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`start, end` `[B, T]` int32: the first and last index of each token's contiguous run of
    equal ids (inside it every pair of tokens is in the same document)."""
    batch, length = segment_ids_BT.shape
    index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    change = segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]
    edge = jnp.ones((batch, 1), bool)
    start = lax.cummax(jnp.where(jnp.concatenate([edge, change], 1), index, 0), axis=1)
    end = lax.cummin(jnp.where(jnp.concatenate([change, edge], 1), index, length - 1), axis=1,
                     reverse=True)
    return start, end


def visible_span(segment_ids_BT: jax.Array, window: int | None) -> tuple[jax.Array, ...]:
    """Per token, `[B, T]` int32 each (causal, window w, same document):

    lowest_key: the first key query t can see; highest_query: the last query that sees key t.
    unmasked_from: every key in [unmasked_from, t] is visible from query t; unmasked_until:
    every query in [t, unmasked_until] sees key t. Key blocks inside these need no mask.
    """
    first, last = segment_extents(segment_ids_BT)
    run_start, run_end = run_extents(segment_ids_BT)
    if window is not None:
        index = jnp.arange(segment_ids_BT.shape[1], dtype=jnp.int32)[None]
        first, run_start = (jnp.maximum(x, index - window + 1) for x in (first, run_start))
        last, run_end = (jnp.minimum(x, index + window - 1) for x in (last, run_end))
    return first, last, run_start, run_end
