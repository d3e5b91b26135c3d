"""Which key blocks a query block can see, and the reverse, from the segment ids (in XLA).

The kernels visit only the key blocks between these bounds, so attention over packed documents
and sliding windows costs the band they cover, not the full causal triangle. Segment ids need
not be contiguous: a document's extent is the span from its first to its last token (found by
one sort), so the bounds stay exact (conservative) for any id pattern.
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


def visible_span(segment_ids_BT: jax.Array | None, length: int, window: int | None
                 ) -> tuple[jax.Array, jax.Array]:
    """`lowest_key, highest_query` `[B, T]` int32: the first key query t can see, and the
    last query that can see key t (causal, window w, same document)."""
    index = jnp.arange(length, dtype=jnp.int32)[None]
    if segment_ids_BT is None:
        first, last = jnp.zeros_like(index), jnp.full_like(index, length - 1)
    else:
        first, last = segment_extents(segment_ids_BT)
    if window is not None:
        first = jnp.maximum(first, index - window + 1)
        last = jnp.minimum(last, index + window - 1)
    return first, last
