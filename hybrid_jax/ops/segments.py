"""Packed documents in the ops: one convention for every recurrence and every rung.

`segment_ids` `[B, T]` (integers): a token whose id differs from the previous token's starts a
new document; the first token of a call continues `initial_state` (with no initial state that
is the zero state anyway). A recurrence's state is zero *before* each document's first token,
so nothing written in one document is read in the next.

Each op turns `segment_ids` into `starts` (`document_starts`) and its rungs apply them: the
per-token references literally (`reset_state` before the step), the chunked rungs through the
decay: the start token's log decay becomes `RESET_LOG_DECAY` (`reset_log_decay`; e^{−120} is 0
in float32 while chunk-cumulative log decays stay small enough for float32), or its
multiplicative decay 0 where a rung scans decays directly. The SSD and gated-delta-rule Pallas
kernels apply the same starts as masks on their chunk weights (`pallas_kernels/ssd/
chunk_math.py`, `pallas_kernels/delta_rule/chunk_math.py`), which keeps float32 accuracy however
many documents a chunk holds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_dims, check_integer

RESET_LOG_DECAY = -120.0


def document_starts(op: str, segment_ids: jax.Array | None, batch: int, length: int
                    ) -> jax.Array | None:
    """`[B, T]` bool, True where a document starts after the first token; None without ids."""
    if segment_ids is None:
        return None
    check_dims(op, {"B": batch, "T": length}, segment_ids=(segment_ids, "BT"))
    check_integer(op, segment_ids=segment_ids)
    return jnp.concatenate([jnp.zeros_like(segment_ids[:, :1], bool),
                            segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)


def document_index(segment_ids_BT: jax.Array) -> jax.Array:
    """Each token's document number in its row, `[B, T]` int32 from 0: a token whose id differs
    from the previous token's starts the next document. As `ops.attention`'s segment ids (which
    join equal ids wherever they are), an id that comes back later in a row is a new document
    there, as for the recurrences."""
    starts = segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]
    return jnp.pad(jnp.cumsum(starts, axis=1, dtype=jnp.int32), ((0, 0), (1, 0)))


def _expand(starts_BT: jax.Array, like: jax.Array) -> jax.Array:
    return starts_BT.reshape(starts_BT.shape + (1,) * (like.ndim - 2))


def reset_log_decay(log_decay: jax.Array, starts_BT: jax.Array | None) -> jax.Array:
    """`log_decay` `[B, T, ...]` with `RESET_LOG_DECAY` at document starts."""
    if starts_BT is None:
        return log_decay
    return jnp.where(_expand(starts_BT, log_decay), RESET_LOG_DECAY, log_decay)


def reset_decay(decay: jax.Array, starts_BT: jax.Array | None) -> jax.Array:
    """Multiplicative `decay` `[B, T, ...]` with 0 at document starts."""
    if starts_BT is None:
        return decay
    return jnp.where(_expand(starts_BT, decay), 0, decay)


def reset_state(state: jax.Array, start_B: jax.Array | None) -> jax.Array:
    """A per-token reference's state `[B, ...]` zeroed where this token starts a document."""
    if start_B is None:
        return state
    return jnp.where(start_B.reshape(start_B.shape + (1,) * (state.ndim - 1)), 0, state)
