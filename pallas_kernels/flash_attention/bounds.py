"""Which key blocks a query block can see, and the reverse, from the segment ids (in XLA).

The kernels visit only the key blocks between these bounds, so attention over packed documents
and sliding windows costs the band they cover, not the full causal triangle. Segment ids need
not be contiguous: a document's extent is the span from its first to its last token (found by
one sort), so the bounds are exact for contiguous documents and never too tight for any id
pattern.

Two steps: `document_extents` (the sort; depends on the segment ids only, so a model computes
it once per batch and hands it to every layer) and `visible_span` (the window; cheap).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Extents(NamedTuple):
    """Per token, `[B, T]` int32 each: `first` / `last`, the first and last index holding its
    id; `run_start` / `run_end`, the first and last index of its contiguous run of equal ids
    (inside a run every pair of tokens is in the same document)."""

    first: jax.Array
    last: jax.Array
    run_start: jax.Array
    run_end: jax.Array


def _runs(keys_BT: jax.Array, index_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Start and end index (along axis 1) of each position's run of equal `keys_BT`."""
    batch, length = keys_BT.shape
    change = keys_BT[:, 1:] != keys_BT[:, :-1]
    edge = jnp.ones((batch, 1), bool)
    start = lax.cummax(jnp.where(jnp.concatenate([edge, change], 1), index_BT, 0), axis=1)
    end = lax.cummin(jnp.where(jnp.concatenate([change, edge], 1), index_BT, length - 1),
                     axis=1, reverse=True)
    return start, end


def document_extents(segment_ids_BT: jax.Array | None, shape_BT: tuple[int, int] | None = None
                     ) -> Extents:
    """The `Extents` of segment ids `[B, T]`; None (one document per row, of `shape_BT`) needs
    no sort."""
    if segment_ids_BT is None:
        batch, length = shape_BT
        zeros = jnp.zeros((batch, length), jnp.int32)
        return Extents(zeros, zeros + length - 1, zeros, zeros + length - 1)
    batch, length = segment_ids_BT.shape
    index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    ids, order = lax.sort((segment_ids_BT, index), dimension=1, num_keys=2)
    sorted_start, sorted_end = _runs(ids, index)
    rows = jnp.arange(batch)[:, None]
    inverse = jnp.zeros_like(order).at[rows, order].set(index)  # sorted position of each token
    first = jnp.take_along_axis(order, sorted_start, 1)
    last = jnp.take_along_axis(order, sorted_end, 1)
    run_start, run_end = _runs(segment_ids_BT, index)
    return Extents(jnp.take_along_axis(first, inverse, 1), jnp.take_along_axis(last, inverse, 1),
                   run_start, run_end)


def pad_extents(extents: Extents, padded_length: int) -> Extents:
    """The extents after padding the segment ids to `padded_length` with the last id (the pad
    joins the last token's document and run)."""
    length = extents.first.shape[1]
    if padded_length == length:
        return extents
    widen = lambda x: jnp.where(x == length - 1, padded_length - 1, x)
    pad = lambda x: jnp.pad(x, [(0, 0), (0, padded_length - length)], mode="edge")
    return Extents(pad(extents.first), pad(widen(extents.last)), pad(extents.run_start),
                   pad(widen(extents.run_end)))


def visible_span(extents: Extents, window: int | None) -> tuple[jax.Array, ...]:
    """Per token, `[B, T]` int32 each (causal, window w, same document):

    lowest_key: the first key query t can see; highest_query: the last query that sees key t.
    unmasked_from: every key in [unmasked_from, t] is visible from query t; unmasked_until:
    every query in [t, unmasked_until] sees key t. Key blocks inside these need no mask.
    """
    first, last, run_start, run_end = extents
    if window is not None:
        index = jnp.arange(first.shape[1], dtype=jnp.int32)[None]
        first, run_start = (jnp.maximum(x, index - window + 1) for x in (first, run_start))
        last, run_end = (jnp.minimum(x, index + window - 1) for x in (last, run_end))
    return first, last, run_start, run_end
