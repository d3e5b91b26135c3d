"""Autoregressive generation: one prefill, then a compiled loop of single-token decode steps."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.cache import check_token_ids
from hybrid_jax.nn.lm import LanguageModel


def sample_token(logits_BV: jax.Array, key: jax.Array, *, temperature: float,
                 top_k: int | None) -> jax.Array:
    """Greedy when `temperature == 0`, else sampling from the (top-k) tempered softmax."""
    if temperature == 0:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits = logits_BV / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def generate(model: LanguageModel, prompt_BT: jax.Array, max_new_tokens: int, *,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
             max_len: int | None = None, extras: dict[str, jax.Array] | None = None
             ) -> jax.Array:
    """Returns `[B, max_new_tokens]` tokens continuing `prompt_BT`.

    The cache holds `max_len` positions (default: prompt + new tokens); sliding-window layers
    keep only their window. `extras`: per-token arrays `[B, prompt + max_new_tokens, ...]` for
    mixers that read them (the `TokenContext` of the prompt, then of each generated token, e.g.
    a per-token mode schedule). Prompt ids outside the vocabulary, a negative or non-finite
    temperature and a `top_k` outside `[1, vocab_size]` raise ValueError.
    """
    prompt = np.asarray(prompt_BT)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"prompt must be an integer array [batch, time] with time >= 1, got "
                         f"shape {prompt.shape} dtype {prompt.dtype}")
    check_token_ids(prompt, model.config.vocab_size, "prompt token")
    prompt_BT = jnp.asarray(prompt, jnp.int32)
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_int(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(temperature, int | float) or not (math.isfinite(temperature)
                                                          and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got "
                         f"{temperature!r}")
    if top_k is not None and (not _is_int(top_k) or not 1 <= top_k <= model.config.vocab_size):
        raise ValueError(f"top_k must be an integer in [1, vocab_size="
                         f"{model.config.vocab_size}] or None, got {top_k!r}")
    needed = prompt_BT.shape[1] + max_new_tokens
    max_len = needed if max_len is None else max_len
    if not _is_int(max_len) or max_len < needed:
        raise ValueError(f"max_len={max_len} is shorter than prompt + new tokens = {needed}")
    extras = dict(extras or {})
    for name, array in extras.items():
        if tuple(array.shape[:2]) != (prompt_BT.shape[0], needed):
            raise ValueError(f"extras[{name!r}]: expected leading shape [batch, prompt + "
                             f"max_new_tokens] = {[prompt_BT.shape[0], needed]}, got "
                             f"{list(array.shape)}")
    graphdef, state = nnx.split(model)
    return _generate(graphdef, state, prompt_BT, jax.random.key(seed), extras, max_new_tokens,
                     temperature, top_k, max_len)


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7, 8))
def _generate(graphdef, state, prompt_BT, key, extras, max_new_tokens, temperature, top_k,
              max_len):
    model = nnx.merge(graphdef, state)
    prompt_len = prompt_BT.shape[1]
    cache = model.init_cache(prompt_BT.shape[0], max_len)
    logits, cache = model.decode(prompt_BT, cache,
                                 extras={k: v[:, :prompt_len] for k, v in extras.items()})
    keys = jax.random.split(key, max_new_tokens)
    first = sample_token(logits[:, -1], keys[0], temperature=temperature, top_k=top_k)
    # Step j feeds the token at position prompt_len + j with its extras.
    step_extras = {k: jnp.moveaxis(v[:, prompt_len:prompt_len + max_new_tokens - 1], 1, 0)
                   for k, v in extras.items()}

    def step(carry, inputs):
        (token, cache), (key, token_extras) = carry, inputs
        logits, cache = model.decode(token[:, None], cache,
                                     extras={k: v[:, None] for k, v in token_extras.items()})
        next_token = sample_token(logits[:, -1], key, temperature=temperature, top_k=top_k)
        return (next_token, cache), token

    (last, _), tokens = jax.lax.scan(step, (first, cache), (keys[1:], step_extras))
    return jnp.concatenate([tokens.T, last[:, None]], axis=1)
