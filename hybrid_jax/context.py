"""The per-token context: what a mixer may need about each token besides its features.

One `TokenContext` travels from the batch (or `generate`'s schedule) through
`LanguageModel.__call__` / `decode`, every block and every mixer, in training, eval, decode and
generation:

    positions    [B, T] int32   position of each token in its document (RoPE, learned tables);
                                by default counted from each document's start
    segment_ids  [B, T] int     packed-document ids, or None (one document per row); a token
                                whose id differs from the previous token's starts a document.
                                `create` stores each token's document number (`document_index`),
                                so an id that comes back later in a row ([1 1 2 2 1 1]) is a
                                new document for attention too, as for the recurrences (the
                                attention op alone joins equal ids wherever they are)
    extras       {name: [B, T, ...]}  any other per-token array a mixer reads by name (e.g.
                                Oryx's mode array); blocks and the model pass it through untouched
    segment_extents  `ops.segment_extents(segment_ids)` (4 × [B, T] int32), made by `create`
                                once per batch so that the attention layers do not each sort the
                                ids for the flash kernel's block bounds; None without segment ids
                                (or in a context built field by field: the kernel then computes it)

It is a pytree (a `flax.struct` dataclass), so it crosses `jit`, `scan` and `remat`. A batch
dict becomes one with `TokenContext.from_batch`: its `positions` and `segment_ids` entries, and
every entry named `extra.NAME` as `extras[NAME]`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import struct

from hybrid_jax.ops.attention import segment_extents
from hybrid_jax.ops.segments import document_index

EXTRA_PREFIX = "extra."


@struct.dataclass
class TokenContext:
    """Per-token arrays shared by every layer of one forward or decode call (module docstring)."""

    positions: jax.Array  # [B, T] int32
    segment_ids: jax.Array | None = None  # [B, T] int
    extras: dict[str, jax.Array] = struct.field(default_factory=dict)  # name -> [B, T, ...]
    segment_extents: tuple[jax.Array, ...] | None = None  # of segment_ids (module docstring)
    # Decoding only: mixers that can keep their state after each new token do (Oryx; for
    # speculative decoding's roll-back, `hybrid_jax.speculative`).
    record_steps: bool = struct.field(pytree_node=False, default=False)
    # Decoding only: the cache holds nothing yet (a prefill), so attention attends among these
    # tokens alone, as in the forward, on its fast rungs (`LanguageModel.decode`).
    fresh_cache: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def create(cls, shape_BT: tuple[int, int], *, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None, start: jax.Array | int = 0,
               extras: Mapping[str, jax.Array] | None = None,
               record_steps: bool = False, fresh_cache: bool = False) -> TokenContext:
        """A checked context for `[B, T]` tokens; positions default to `start + 0..T−1`, and
        with segment ids to each token's place in its document (the first document from
        `start`, every later one from 0), as the packers write them."""
        extras = dict(extras or {})
        for name, array in [("positions", positions), ("segment_ids", segment_ids),
                            *((f"extras[{n!r}]", a) for n, a in extras.items())]:
            if array is not None and tuple(array.shape[:2]) != tuple(shape_BT):
                raise ValueError(f"TokenContext.{name}: expected leading shape [batch, time] = "
                                 f"{list(shape_BT)} (the tokens'), got {list(array.shape)}")
        for name, array in (("positions", positions), ("segment_ids", segment_ids)):
            # One integer a token (extras may carry more); a float id or place is a mistake.
            if array is not None and (array.ndim != 2 or not jnp.issubdtype(array.dtype,
                                                                             jnp.integer)):
                raise ValueError(f"TokenContext.{name}: expected an integer array [batch, time] "
                                 f"= {list(shape_BT)}, got shape {list(array.shape)} dtype "
                                 f"{array.dtype}")
        # A [B] start would broadcast along time, silently when B == T.
        if jnp.ndim(start) != 0 or not jnp.issubdtype(jnp.result_type(start), jnp.integer):
            raise ValueError(f"TokenContext.start: expected one integer (the position of the "
                             f"first token), got shape {list(jnp.shape(start))} dtype "
                             f"{jnp.result_type(start)}")
        index_BT = jnp.broadcast_to(jnp.arange(shape_BT[1], dtype=jnp.int32), shape_BT)
        if segment_ids is not None:
            segment_ids = document_index(segment_ids)
        if positions is None and segment_ids is None:
            positions = start + index_BT
        elif positions is None:
            first = jax.lax.cummax(jnp.where(jnp.diff(segment_ids, axis=1, prepend=0) > 0,
                                             index_BT, 0), axis=1)
            positions = index_BT - first + jnp.where(segment_ids == 0, start, 0)
        extents = None if segment_ids is None else segment_extents(segment_ids)
        return cls(positions=positions, segment_ids=segment_ids, extras=extras,
                   segment_extents=extents, record_steps=record_steps, fresh_cache=fresh_cache)

    @classmethod
    def from_batch(cls, batch: Mapping[str, jax.Array]) -> TokenContext:
        """The context of a training/eval batch dict (see the module docstring)."""
        extras = {k[len(EXTRA_PREFIX):]: v for k, v in batch.items() if k.startswith(EXTRA_PREFIX)}
        return cls.create(tuple(batch["inputs"].shape), positions=batch.get("positions"),
                          segment_ids=batch.get("segment_ids"), extras=extras)

    def extra(self, name: str) -> jax.Array:
        """`extras[name]`, or a ValueError naming the extras this context has."""
        if name not in self.extras:
            raise ValueError(f"this mixer needs the per-token array {name!r} in the context "
                             f"(batch key '{EXTRA_PREFIX}{name}', or extras={{{name!r}: ...}} "
                             f"of the model call / generate); the context has "
                             f"{sorted(self.extras)}")
        return self.extras[name]
