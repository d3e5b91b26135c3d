"""Autoregressive generation: one prefill, then a compiled loop of single-token decode steps.

Text in and out (a tokenizer, prompts as strings, stop strings): `hybrid_jax.generate_text`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import io_callback
from jax.sharding import PartitionSpec

from hybrid_jax.cache import check_cache_fits, check_token_ids
from hybrid_jax.modes import check_reads_modes, inference_modes
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.nn.oryx import ATTENTION, MODE
from hybrid_jax.sharding import on_automatic_axes, type_spec
from hybrid_jax.speculative import accepted_drafts, check_speculative, draft_and_verify, rollback


def sample_token(logits_BV: jax.Array, key: jax.Array, *, temperature: float | jax.Array,
                 top_k: int | None, top_p: float | jax.Array | None = None) -> jax.Array:
    """Greedy when `temperature` is the number 0, else sampling from the tempered softmax
    restricted to the `top_k` largest logits and to the smallest set whose probability reaches
    `top_p`. `temperature` and `top_p` may be traced scalars (one compile for all values);
    `top_k` sets a shape and is static."""
    if isinstance(temperature, int | float) and temperature == 0:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    # Shifted by the row's maximum before the division (the softmax is the same): a tiny
    # temperature (down to one that float32 rounds to 0) then sends the other logits to −inf,
    # never the maximum to NaN nor every positive logit to +inf (1e-39 sampled any of them).
    shifted = logits_BV - jnp.max(logits_BV, axis=-1, keepdims=True)
    logits = jnp.where(shifted == 0, 0.0, shifted / temperature)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p is not None and not (isinstance(top_p, int | float) and top_p >= 1):
        desc = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(desc, axis=-1)
        keep = jnp.cumsum(probs, axis=-1) - probs < top_p  # the first always stays
        cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def generate(model: LanguageModel, prompt_BT: jax.Array, max_new_tokens: int, *,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int = 0, max_len: int | None = None, lengths: Sequence[int] | None = None,
             eos_id: int | None = None, on_tokens: Callable | None = None,
             extras: dict[str, jax.Array] | None = None, modes: Any = None,
             max_positions: int | None = None, speculative: int | None = None,
             stats: dict | None = None) -> jax.Array:
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
    One compile per shape (batch, prompt width, `max_new_tokens`, `max_len`, shortest prompt)
    and sampling kind (greedy or not, `top_k`, top-p on or off, `speculative`): the seed,
    temperature, `top_p`, `eos_id` and `on_tokens` are arguments of the compiled loop.
    The cache holds `max_len` positions (default: longest prompt + new tokens, + k with
    `speculative=k`); sliding-window layers keep only their window. `extras`: per-token
    arrays `[B, T + max_new_tokens, ...]` (T = `prompt_BT.shape[1]`) for mixers that read
    them, indexed by position (the `TokenContext` of each fed token). `modes`: Oryx's
    per-token mode schedule, "linear", "attention", "prefill=linear,decode=attention" (each
    row's own prompt is its prefill) or a `[B, T + max_new_tokens]` 0/1 array
    (`hybrid_jax.modes.inference_modes`).
    `speculative=k` (Oryx models, greedy): self-speculative decoding, k linear-mode drafts
    verified by one attention-mode call per round (`hybrid_jax.speculative`); the tokens are
    those of `modes="attention"` greedy decoding; it takes no `extras`. A `stats` dict is
    filled with the rounds, the drafts' acceptance rate (accepted / drafted over the rows
    generating from a round's start: a row inside its prompt verifies prompt tokens) and the
    tokens kept per round. Under a mesh with explicit axes the loop runs on automatic ones
    (`sharding.on_automatic_axes`) and the tokens come back split by rows as the prompt is.
    `max_positions`: the model's position limit (e.g. a Hugging Face model's
    max_position_embeddings; default the config's `max_positions`, None for RoPE models).
    Prompt ids (within `lengths`) outside the vocabulary, a prompt that leaves no room for
    `max_new_tokens` within `max_positions` (nor, with `speculative=k`, for k more in a learned
    position table), a negative or non-finite temperature, a `top_k` outside
    `[1, vocab_size]`, a `top_p` outside (0, 1], an `eos_id` outside the vocabulary,
    non-integer `lengths`, `modes` for a model without Oryx layers or beside an `extras`
    mode array, and a decode cache larger than the device's memory raise ValueError.
    `temperature` and `top_p` take any real scalar (Python, NumPy such as `np.float32`).
    """
    # The new tokens' rows lie as the prompt's under a mesh with explicit axes.
    rows = type_spec(prompt_BT)[:1] if isinstance(prompt_BT, jax.Array) else ()
    prompt = np.asarray(prompt_BT)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"prompt must be an integer array [batch, time] with time >= 1, got "
                         f"shape {prompt.shape} dtype {prompt.dtype}")
    prompt_BT = jnp.asarray(prompt, jnp.int32)
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_int(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    given_temperature, temperature = temperature, _as_float(temperature)
    if temperature is None or not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got "
                         f"{given_temperature!r}")
    if top_k is not None and (not _is_int(top_k) or not 1 <= top_k <= model.config.vocab_size):
        raise ValueError(f"top_k must be an integer in [1, vocab_size="
                         f"{model.config.vocab_size}] or None, got {top_k!r}")
    given_top_p, top_p = top_p, None if top_p is None else _as_float(top_p)
    if given_top_p is not None and not (top_p is not None and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {given_top_p!r}")
    if eos_id is not None and (not _is_int(eos_id) or not 0 <= eos_id < model.config.vocab_size):
        # An id the model cannot sample would never stop a row.
        raise ValueError(f"eos_id must be a token id in [0, vocab_size="
                         f"{model.config.vocab_size}) or None, got {eos_id!r}")
    lengths = np.full(prompt_BT.shape[0], prompt_BT.shape[1]) if lengths is None else (
        np.asarray(lengths))
    if lengths.shape != prompt_BT.shape[:1] or not np.issubdtype(lengths.dtype, np.integer) or (
            not (1 <= lengths).all() or (lengths > prompt_BT.shape[1]).any()):
        raise ValueError(f"lengths must be [batch={prompt_BT.shape[0]}] integer prompt lengths in "
                         f"[1, {prompt_BT.shape[1]}], got {lengths.tolist()}")
    # The padding after a row's prompt is never read: any value (-1, a pad id) will do.
    check_token_ids(np.where(np.arange(prompt.shape[1]) < lengths[:, None], prompt, 0),
                    model.config.vocab_size, "prompt token")
    if speculative is not None:
        if not _is_int(speculative) or speculative < 1:
            raise ValueError(f"speculative must be an integer >= 1 (drafts per round), got "
                             f"{speculative!r}")
        if temperature != 0 or modes is not None:
            raise ValueError("speculative decoding is greedy (temperature 0) and sets the modes "
                             "itself (linear drafts, attention verification): got temperature="
                             f"{temperature}, modes={modes!r}")
        if extras:  # its rounds pass the modes alone: other extras would be dropped
            raise ValueError(f"speculative decoding takes no extras (it passes only the modes to "
                             f"its draft and verification steps): got extras {sorted(extras)}")
    limit = max_positions or model.config.max_positions
    if limit is not None and int(lengths.max()) + max_new_tokens > limit:
        raise ValueError(f"prompt of {int(lengths.max())} tokens + {max_new_tokens} new tokens "
                         f"is longer than the model's {limit} positions")
    spare = speculative or 0  # a round may write up to k positions past the last one kept
    needed = int(lengths.max()) + max_new_tokens + spare
    table = model.config.max_positions  # a learned table: no embedding past it
    if spare and table is not None and needed > table:
        raise ValueError(f"speculative decoding: prompt + new tokens + {spare} drafts = {needed} "
                         f"positions, more than the learned position table's {table}: ask for "
                         "fewer new tokens")
    max_len = needed if max_len is None else max_len
    if not _is_int(max_len) or max_len < needed:
        raise ValueError(f"max_len={max_len} is shorter than prompt + new tokens"
                         + (" + speculative" if spare else "") + f" = {needed}")
    if speculative is not None:
        check_speculative(model, max_len)
    check_cache_fits(model, prompt_BT.shape[0], max_len)
    extras = dict(extras or {})
    width = prompt_BT.shape[1] + max_new_tokens
    if modes is not None:
        check_reads_modes(model, "modes")
        if MODE in extras:  # one of the two schedules would be dropped silently
            raise ValueError(f"give the mode schedule either as modes= or as extras[{MODE!r}], "
                             "not both")
        extras[MODE] = jnp.asarray(inference_modes(modes, lengths, width))
    for name, array in extras.items():
        if tuple(array.shape[:2]) != (prompt_BT.shape[0], width):
            raise ValueError(f"extras[{name!r}]: expected leading shape [batch, prompt + "
                             f"max_new_tokens] = {[prompt_BT.shape[0], width]}, got "
                             f"{list(array.shape)}")
    graphdef, state = nnx.split(model)
    sampling = dict(greedy=temperature == 0, top_k=top_k,
                    top_p=top_p is not None and top_p < 1)
    handle = next(_HANDLES) if on_tokens is not None else 0
    if on_tokens is not None:
        _ON_TOKENS[handle] = on_tokens
    try:
        with _ctrl_c_ends_loop(handle):
            loop = functools.partial(
                _generate, graphdef, max_new_tokens=max_new_tokens, max_len=max_len,
                prefix=int(lengths.min()), streaming=on_tokens is not None,
                speculative=speculative, **sampling)
            tokens, counts = on_automatic_axes(
                loop, (PartitionSpec(*rows, None), PartitionSpec()), state, prompt_BT,
                jnp.asarray(lengths, jnp.int32), jax.random.key(seed), extras,
                jnp.float32(temperature or 1.0), jnp.float32(top_p or 1.0),
                jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(handle))
            # The host callback must outlive the computation (dispatch is asynchronous).
            if on_tokens is not None:
                tokens = jax.block_until_ready(tokens)
    finally:
        _ON_TOKENS.pop(handle, None)
        error = _FAILED.pop(handle, None)
    if error is not None:
        raise error
    if stats is not None and speculative is not None:
        rounds, accepted, drafted, kept = (int(x) for x in counts)
        stats.update(rounds=rounds, acceptance_rate=accepted / max(drafted, 1),
                     tokens_per_round=kept / max(rounds, 1))
    return tokens


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _as_float(value: object) -> float | None:
    """A real scalar (Python, NumPy such as `np.float32`, or a concrete 0-d array) as a float;
    None for anything else (a bool, a string, an array with axes, a traced value)."""
    if isinstance(value, bool | np.bool_):
        return None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, jax.errors.TracerArrayConversionError):
        return None
    if array.shape != () or not (np.issubdtype(array.dtype, np.floating)
                                 or np.issubdtype(array.dtype, np.integer)):
        return None
    return float(array)


# `on_tokens` of the calls in flight, by handle. The compiled loop calls `_call_on_tokens`
# with its call's handle (a traced argument), so changing callbacks (streaming, stop strings)
# reuse one compiled loop per shape instead of compiling per callback object.
_ON_TOKENS: dict[int, Callable] = {}
_HANDLES = itertools.count(1)


# The exception `on_tokens` raised, by handle: the loop ends at its next step and `generate`
# raises it (out of the callback it came as an XLA error that hid it, e.g. a closed pipe's
# BrokenPipeError from a streaming print).
_FAILED: dict[int, BaseException] = {}


def _call_on_tokens(handle, position, tokens_B, new_B) -> np.ndarray:
    ctrl_c = _CTRL_C.get(int(handle))
    if (ctrl_c is not None and ctrl_c.pressed()) or int(handle) in _FAILED:
        return np.ones(np.shape(new_B), bool)  # every row stops: the loop ends
    try:
        return np.asarray(_ON_TOKENS[int(handle)](position, tokens_B, new_B), bool)
    except Exception as error:
        _FAILED[int(handle)] = error
        return np.ones(np.shape(new_B), bool)


class _CtrlC:
    """Whether Ctrl-C came during a streaming loop, as its callback sees it: from the SIGINT
    handler (`_ctrl_c_ends_loop` installs one that only records it) or, while the main thread
    waits in XLA and no handler can run, from the signal wakeup socket `wakeup`."""

    def __init__(self, wakeup: socket.socket | None):
        self.wakeup, self.seen = wakeup, False

    def pressed(self) -> bool:
        if not self.seen and self.wakeup is not None:
            try:
                self.seen = signal.SIGINT in self.wakeup.recv(256)
            except BlockingIOError:  # nothing arrived
                pass
        return self.seen


# The Ctrl-C watch of each streaming call in flight, by handle.
_CTRL_C: dict[int, _CtrlC] = {}


@contextlib.contextmanager
def _ctrl_c_ends_loop(handle: int) -> Iterator[None]:
    """Lets Ctrl-C end the streaming loop of call `handle` (nonzero) at its next step, then
    passes it on to the SIGINT handler that was there (KeyboardInterrupt by default).

    Python runs a SIGINT handler only in the main thread between bytecodes: while the main
    thread waits in XLA (a CPU call blocks until the loop is done) Ctrl-C would wait for the
    last token, and when the handler runs inside a callback on the main thread its
    KeyboardInterrupt would come out as an XLA callback error. So the handler only records it,
    and `signal.set_wakeup_fd` has the signal written to a socket the moment it arrives, which
    the callback reads (unless something else, an asyncio loop, holds the wakeup fd). Only in
    the main thread, with a Python SIGINT handler."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if handle and main else None
    if not callable(previous):
        yield
        return
    read, write = socket.socketpair()
    read.setblocking(False)
    write.setblocking(False)
    other = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    if other != -1:  # someone else's: left in place
        signal.set_wakeup_fd(other)
    ctrl_c = _CTRL_C[handle] = _CtrlC(read if other == -1 else None)
    signal.signal(signal.SIGINT, lambda signum, frame: setattr(ctrl_c, "seen", True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if other == -1:
            signal.set_wakeup_fd(-1)
        read.close()
        write.close()
        del _CTRL_C[handle]
    if ctrl_c.seen:
        signal.raise_signal(signal.SIGINT)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "max_len", "prefix",
                                             "streaming", "greedy", "top_k", "top_p",
                                             "speculative"))
def _generate(graphdef, state, prompt_BT, lengths_B, key, extras, temperature, top_p_value,
              stop_value, handle, *, max_new_tokens, max_len, prefix, streaming, greedy, top_k,
              top_p, speculative):
    """The tokens `[B, max_new_tokens]` and, with `speculative`, the int32 counts (rounds,
    accepted drafts, drafts of generating rows, tokens kept). Static: shapes, which sampling
    steps run and the drafts per round. Temperature, top-p, the EOS id (`stop_value`, -1:
    none) and the callback handle are traced."""
    model = nnx.merge(graphdef, state)
    batch = prompt_BT.shape[0]
    width = prompt_BT.shape[1] + max_new_tokens
    # Columns past `width` are read (never kept) by a speculative round near the end.
    tokens_BW = jnp.pad(prompt_BT, ((0, 0), (0, max_new_tokens + (speculative or 0) + 1)))
    prefill_extras = {k: v[:, :prefix] for k, v in extras.items()}
    if speculative is not None:  # the attention-mode continuation, whatever the default mode
        prefill_extras[MODE] = jnp.full((batch, prefix), ATTENTION, jnp.int32)
    logits, cache = model.decode(prompt_BT[:, :prefix], model.init_cache(batch, max_len),
                                 extras=prefill_extras, fresh_cache=True)

    def emit(position, candidate_B, tokens_BW, done_B):
        """Writes each row's token at `position`: its prompt token, else `candidate_B`
        (`stop_value` once the row is done); the rows that end there are done."""
        generated = position >= lengths_B
        token = jnp.where(generated, jnp.where(done_B, stop_value, candidate_B),
                          tokens_BW[:, position])
        new = generated & ~done_B
        done_B = done_B | (new & (token == stop_value)) | (
            position + 1 >= lengths_B + max_new_tokens)
        if streaming:
            stop = io_callback(_call_on_tokens, jax.ShapeDtypeStruct((batch,), jnp.bool_),
                               handle, position, token, new, ordered=True)
            done_B = done_B | (generated & stop)
        tokens_BW = jax.lax.dynamic_update_slice(tokens_BW, token[:, None], (0, position))
        return token, tokens_BW, done_B

    def step(carry):
        position, logits_BV, cache, tokens_BW, done_B, counts = carry
        sampled = sample_token(logits_BV, jax.random.fold_in(key, position),
                               temperature=0 if greedy else temperature, top_k=top_k,
                               top_p=top_p_value if top_p else None)
        token, tokens_BW, done_B = emit(position, sampled, tokens_BW, done_B)
        token_extras = {k: jax.lax.dynamic_slice_in_dim(v, position, 1, axis=1)
                        for k, v in extras.items()}
        logits, cache = model.decode(token[:, None], cache, extras=token_extras)
        return position + 1, logits[:, -1], cache, tokens_BW, done_B, counts

    def speculative_round(carry):
        position, logits_BV, cache, tokens_BW, done_B, counts = carry
        greedy = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        next_B = jnp.where(position < lengths_B, tokens_BW[:, position], greedy)
        block, targets, logits, recorded = draft_and_verify(
            model, cache, tokens_BW, lengths_B, position, next_B, speculative)
        accepted_B = accepted_drafts(block, targets)
        n = jnp.min(jnp.where(done_B, speculative, accepted_B))
        cache = rollback(recorded, speculative + 1, n + 1)
        tokens_BW, done_B_after = jax.lax.fori_loop(
            0, n + 1, lambda i, c: emit(position + i, block[:, i], *c)[1:], (tokens_BW, done_B))
        # Rows generating from the round's start: a row still inside its prompt verifies its
        # prompt's tokens, not drafts, and would inflate the acceptance rate.
        active = ~done_B & (position >= lengths_B)
        counts = counts + jnp.stack([1, jnp.sum(jnp.where(active, accepted_B, 0)),
                                     speculative * jnp.sum(active), n + 1]).astype(jnp.int32)
        return (position + n + 1, jax.lax.dynamic_index_in_dim(logits, n, 1, keepdims=False),
                cache, tokens_BW, done_B_after, counts)

    carry = (jnp.int32(prefix), logits[:, -1], cache, tokens_BW, jnp.zeros((batch,), bool),
             jnp.zeros((4,), jnp.int32))
    carry = jax.lax.while_loop(lambda c: (c[0] < width) & ~jnp.all(c[4]),
                               step if speculative is None else speculative_round, carry)
    index_BN = lengths_B[:, None] + jnp.arange(max_new_tokens)
    # Rows that all ended early leave the later columns unwritten: they read as stopped.
    tokens = jnp.where(index_BN < carry[0], jnp.take_along_axis(carry[3], index_BN, axis=1),
                       stop_value)
    return tokens, carry[5]
