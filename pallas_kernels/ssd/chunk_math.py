"""The decays of one chunk of the SSD recurrence, shared by the GPU and TPU kernels.

One head, one chunk of L steps with log decays `a` (`dt·A`, float32, ≤ 0) and, with packed
documents, `doc`: the number of document starts in the chunk at or before each step (0 while the
chunk still continues the document it entered with). The entering state reaches step t with
e^{cum_t}, a write at step s reaches t ≥ s with e^{cum_t − cum_s} (cum: inclusive cumulative
sum within the chunk), and nothing crosses a document start. Document starts are applied as
masks on these weights rather than as a large negative log decay: the chunk sums then stay
small, so e^{cum_t − cum_s} keeps float32 accuracy however many documents a chunk holds (the
meaning is `hybrid_jax.ops.segments`': the state is zero before each document's first token).
The log decay of a document's first token is never read. `cumsum` is the lowering's inclusive
cumulative sum of a vector (Triton's `jnp.cumsum`; a triangular matmul on Mosaic TPU, which has
none).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


class ChunkWeights(NamedTuple):
    """Per-step decays of one chunk (vectors `[L]`, float32)."""

    cum: jax.Array  # inclusive cumulative log decay from the chunk start
    into: jax.Array  # e^{cum_t}: the entering state's weight at step t (0 after a start)
    out: jax.Array  # e^{cum_last − cum_s}: step s's write as seen at the chunk end
    carry: jax.Array  # scalar e^{cum_last}: the entering state's weight at the chunk end


def chunk_weights(a: jax.Array, doc: jax.Array | None, cumsum=jnp.cumsum,
                  total: jax.Array | None = None) -> ChunkWeights:
    """With `total` (the chunk's whole log decay), `a` is already the inclusive cumulative sum
    (`BlockSizes.cumulative_decay`): no scan or reduction here."""
    if total is None:
        cum, total = cumsum(a), jnp.sum(a)
    else:
        cum = a
    # jnp.exp, not `base2.exp`: with 2^(x·log₂e) here and in `pair_decay`, chunk_grads and
    # chunk_outputs ran 5 % and 8 % slower on the H100 (NOTES.md, session 29).
    into, out, carry = jnp.exp(cum), jnp.exp(total - cum), jnp.exp(total)
    if doc is not None:
        last = jnp.max(doc)  # doc never decreases within a chunk
        into = jnp.where(doc == 0, into, 0.0)
        out = jnp.where(doc == last, out, 0.0)
        carry = jnp.where(last == 0, carry, 0.0)
    return ChunkWeights(cum, into, out, carry)


def pair_decay(cum: jax.Array, doc: jax.Array | None) -> jax.Array:
    """`[L, L]` e^{cum_t − cum_s} for s ≤ t in one document, else 0 (masked before exp)."""
    size = cum.shape[0]
    rows = lax.broadcasted_iota(jnp.int32, (size, size), 0)
    cols = lax.broadcasted_iota(jnp.int32, (size, size), 1)
    visible = rows >= cols
    if doc is not None:
        visible = visible & (doc[:, None] == doc[None, :])
    return jnp.exp(jnp.where(visible, cum[:, None] - cum[None, :], -jnp.inf))


def reverse_cumsum(x: jax.Array) -> jax.Array:
    """`Σ_{t ≥ j} x_t` of a vector (Triton has only the forward cumulative sum)."""
    return jnp.sum(x) - jnp.cumsum(x) + x
