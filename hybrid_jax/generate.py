"""Autoregressive generation: one prefill, then a compiled loop of single-token decode steps.

Text in and out (a tokenizer, prompts as strings, stop strings): `hybrid_jax.generate_text`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import io_callback

from hybrid_jax.nn.lm import LanguageModel


def sample_token(logits_BV: jax.Array, key: jax.Array, *, temperature: float,
                 top_k: int | None, top_p: float | None = None) -> jax.Array:
    """Greedy when `temperature == 0`, else sampling from the tempered softmax restricted to
    the `top_k` largest logits and to the smallest set whose probability reaches `top_p`."""
    if temperature == 0:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits = logits_BV / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p is not None and top_p < 1:
        desc = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(desc, axis=-1)
        keep = jnp.cumsum(probs, axis=-1) - probs < top_p  # the first always stays
        cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def generate(model: LanguageModel, prompt_BT: jax.Array, max_new_tokens: int, *,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int = 0, max_len: int | None = None, lengths: Sequence[int] | None = None,
             eos_id: int | None = None, on_tokens: Callable | None = None) -> jax.Array:
    """Returns `[B, max_new_tokens]` tokens continuing `prompt_BT`.

    Prompts of different lengths: `lengths[b]` tokens of row b are its prompt (right padding
    after them is never read). The shortest common prefix is prefilled at once; the loop then
    feeds each row its own prompt tokens until they run out and its samples after that, so
    every row sees exactly its prompt at positions 0.. (no padding inside the context, for
    attention and recurrent layers alike). The loop is one compiled `lax.while_loop`; it ends
    when every row has `max_new_tokens` tokens or has produced `eos_id` (later entries of that
    row are `eos_id`). `on_tokens(position, tokens_B, new_B)` runs on the host after each step
    (streaming; `new_B` marks rows that produced a token) and returns a bool `[B]` of rows to
    stop (stop strings). Sampling draws from `fold_in(key(seed), position)`: reproducible.
    The cache holds `max_len` positions (default: longest prompt + new tokens); sliding-window
    layers keep only their window.
    """
    prompt_BT = jnp.asarray(prompt_BT, jnp.int32)
    if prompt_BT.ndim != 2 or prompt_BT.shape[1] < 1:
        raise ValueError(f"prompt must be [batch, time] with time >= 1, got {prompt_BT.shape}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if top_k is not None and not 1 <= top_k <= model.config.vocab_size:
        raise ValueError(f"top_k must be in [1, vocab_size={model.config.vocab_size}], "
                         f"got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    lengths = np.full(prompt_BT.shape[0], prompt_BT.shape[1]) if lengths is None else (
        np.asarray(lengths))
    if lengths.shape != prompt_BT.shape[:1] or not (1 <= lengths).all() or (
            lengths > prompt_BT.shape[1]).any():
        raise ValueError(f"lengths must be [batch={prompt_BT.shape[0]}] prompt lengths in "
                         f"[1, {prompt_BT.shape[1]}], got {lengths.tolist()}")
    needed = int(lengths.max()) + max_new_tokens
    max_len = needed if max_len is None else max_len
    if max_len < needed:
        raise ValueError(f"max_len={max_len} is shorter than prompt + new tokens = {needed}")
    graphdef, state = nnx.split(model)
    return _generate(graphdef, state, prompt_BT, jnp.asarray(lengths, jnp.int32),
                     jax.random.key(seed), max_new_tokens, temperature, top_k, top_p, max_len,
                     int(lengths.min()), eos_id, on_tokens)


@functools.partial(jax.jit, static_argnums=(0, *range(5, 13)))
def _generate(graphdef, state, prompt_BT, lengths_B, key, max_new_tokens, temperature, top_k,
              top_p, max_len, prefix, eos_id, on_tokens):
    model = nnx.merge(graphdef, state)
    batch = prompt_BT.shape[0]
    width = prompt_BT.shape[1] + max_new_tokens
    tokens_BW = jnp.pad(prompt_BT, ((0, 0), (0, max_new_tokens)))
    logits, cache = model.decode(prompt_BT[:, :prefix], model.init_cache(batch, max_len))
    stop_value = -1 if eos_id is None else eos_id

    def step(carry):
        position, logits_BV, cache, tokens_BW, done_B = carry
        sampled = sample_token(logits_BV, jax.random.fold_in(key, position),
                               temperature=temperature, top_k=top_k, top_p=top_p)
        generated = position >= lengths_B
        token = jnp.where(generated, jnp.where(done_B, stop_value, sampled), tokens_BW[:, position])
        new = generated & ~done_B
        done_B = done_B | (new & (token == stop_value)) | (
            position + 1 >= lengths_B + max_new_tokens)
        if on_tokens is not None:
            stop = io_callback(on_tokens, jax.ShapeDtypeStruct((batch,), jnp.bool_), position,
                               token, new, ordered=True)
            done_B = done_B | (generated & stop)
        tokens_BW = jax.lax.dynamic_update_slice(tokens_BW, token[:, None], (0, position))
        logits, cache = model.decode(token[:, None], cache)
        return position + 1, logits[:, -1], cache, tokens_BW, done_B

    carry = (jnp.int32(prefix), logits[:, -1], cache, tokens_BW, jnp.zeros((batch,), bool))
    carry = jax.lax.while_loop(lambda c: (c[0] < width) & ~jnp.all(c[4]), step, carry)
    index_BN = lengths_B[:, None] + jnp.arange(max_new_tokens)
    # Rows that all ended early leave the later columns unwritten: they read as stopped.
    return jnp.where(index_BN < carry[0], jnp.take_along_axis(carry[3], index_BN, axis=1),
                     stop_value)
