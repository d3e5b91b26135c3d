"""Self-speculative decoding of Oryx models: the linear mode drafts, the attention mode verifies.

One round, at position p with the next token t_p known (a prompt token, or the attention-mode
greedy token predicted at p − 1):

1. draft: k single-token decode steps in linear mode from the caches, t_p then each draft,
   give drafts d_{p+1} … d_{p+k} (greedy; the caches of these steps are dropped);
2. verify: ONE attention-mode decode call over [t_p, d_{p+1} … d_{p+k}] from the caches
   before drafting, with `record_steps` (Oryx keeps its linear state and conv inputs after each
   token), gives the attention-mode greedy token a_{p+1+i} after each of them;
3. accept the longest prefix with d = a (n of the k drafts; rows in lockstep: the batch
   keeps the smallest n among rows still generating, so every row stays at one position and
   only verified tokens are kept) and roll the caches back to the n + 1 tokens kept
   (`rollback`): the KV caches forget the later positions, the linear states and convs take
   their value after token p + n. The next round starts at p + n + 1 with t = a_{p+n+1}.

Every kept token was computed in attention mode from attention-mode caches, so the output is
the attention-mode greedy continuation, token for token (`generate(..., speculative=k)`; tested
against `generate(..., modes="attention")`). Each round emits n + 1 tokens for k linear steps
and one attention call of k + 1 tokens. Greedy only: sampling would need the speculative
rejection rule to keep the target distribution.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hybrid_jax.cache import AttentionCache, BlockCache, LinearSteps, LMCache, OryxCache
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.nn.oryx import ATTENTION, LINEAR, MODE


def check_speculative(model: LanguageModel, max_len: int) -> None:
    """Raises ValueError unless every layer's cache can be rolled back (Oryx, full attention,
    stateless branches) and some layer is Oryx (the drafts need a linear mode)."""
    cache = jax.eval_shape(lambda: model.init_cache(1, max_len))
    has_oryx = False
    for i, layer_cache in enumerate(cache.layers):
        branches = layer_cache.branches if isinstance(layer_cache, BlockCache) else (layer_cache,)
        for branch in branches:
            has_oryx |= isinstance(branch, OryxCache)
            if isinstance(branch, AttentionCache) and branch.positions.shape[0] < max_len:
                raise ValueError(f"speculative decoding: layer {i} is sliding-window attention, "
                                 "whose ring buffer cannot be rolled back")
            if branch is not None and not isinstance(branch, OryxCache | AttentionCache):
                raise ValueError(f"speculative decoding: layer {i} ({model.config.layers[i].type})"
                                 f" keeps a {type(branch).__name__}, which cannot be rolled back "
                                 "(supported: Oryx, full attention and stateless branches)")
    if not has_oryx:
        raise ValueError("speculative decoding drafts in Oryx's linear mode: the model has no "
                         "Oryx layer")


def rollback(cache: LMCache, count: int, keep: jax.Array) -> LMCache:
    """`cache` after a `record_steps` decode call of `count` tokens, holding only its first
    `keep` (traced, 1..count) tokens."""
    index = cache.index - count + keep

    def layer(c: Any) -> Any:
        if isinstance(c, BlockCache):
            return BlockCache(tuple(layer(b) for b in c.branches))
        if isinstance(c, OryxCache):
            return OryxCache(linear=layer(c.linear), attention=layer(c.attention))
        if isinstance(c, LinearSteps):
            return c.prefix(keep)
        if isinstance(c, AttentionCache):  # positions from `index` on are forgotten
            return c.replace(positions=jnp.where(c.positions >= index, -1, c.positions))
        if c is None:
            return None
        raise ValueError(f"speculative decoding cannot roll back a {type(c).__name__}")

    return cache.replace(index=index, layers=tuple(layer(c) for c in cache.layers))


def _given_or(tokens_BW, lengths_B, first: jax.Array, count: int, predicted_BK):
    """At positions `first .. first + count − 1`: each row's prompt token where it has one,
    else `predicted_BK`."""
    prompt = jax.lax.dynamic_slice_in_dim(tokens_BW, first, count, axis=1)
    positions = first + jnp.arange(count)
    return jnp.where(positions[None] < lengths_B[:, None], prompt, predicted_BK)


def draft_and_verify(model: LanguageModel, cache: LMCache, tokens_BW, lengths_B,
                     position: jax.Array, next_B: jax.Array, k: int):
    """One round's drafts and verification (module docstring, steps 1–2) from `cache` at
    `position`, whose token is `next_B`. Returns the fed block `[B, k+1]` (t_p, drafts), the
    attention-mode tokens after each `[B, k+1]`, their logits `[B, k+1, V]` and the recorded
    cache (roll it back with `rollback(cache, k + 1, keep)`)."""
    batch = next_B.shape[0]

    def draft(carry, i):
        token_B, cache = carry
        logits, cache = model.decode(token_B[:, None], cache,
                                     extras={MODE: jnp.full((batch, 1), LINEAR, jnp.int32)})
        token_B = _given_or(tokens_BW, lengths_B, position + 1 + i, 1,
                            jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32))[:, 0]
        return (token_B, cache), token_B

    _, drafts_KB = jax.lax.scan(draft, (next_B, cache), jnp.arange(k))
    block = jnp.concatenate([next_B[:, None], drafts_KB.T], axis=1)
    logits, recorded = model.decode(
        block, cache, extras={MODE: jnp.full((batch, k + 1), ATTENTION, jnp.int32)},
        record_steps=True)
    targets = _given_or(tokens_BW, lengths_B, position + 1, k + 1,
                        jnp.argmax(logits, axis=-1).astype(jnp.int32))
    return block, targets, logits, recorded


def accepted_drafts(block_BK1: jax.Array, targets_BK1: jax.Array) -> jax.Array:
    """`[B]` number of leading drafts (block columns 1..k) equal to the verified tokens."""
    match = block_BK1[:, 1:] == targets_BK1[:, :-1]
    return jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)
