"""Text generation: prompts as strings through a tokenizer, stop strings, streaming.

    result = hj.generate_text(model, tokenizer, ["Once upon a time", "The"], max_new_tokens=32,
                              temperature=0.8, top_p=0.95, stop=["\\n\\n"])
    result.texts          # one continuation per prompt

Prompts of different lengths run in one batch (see `hybrid_jax.generate.generate`: each row
sees exactly its own prompt). A row ends at the tokenizer's EOS (or any of `eos_ids`), at a
stop string (checked on the host as tokens arrive; the text is cut before it) or after
`max_new_tokens`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hybrid_jax.data.tokenizer import Tokenizer
from hybrid_jax.generate import generate
from hybrid_jax.nn.lm import LanguageModel


@dataclasses.dataclass(frozen=True)
class TextGeneration:
    texts: list[str]  # one continuation per prompt, cut at EOS / stop strings
    tokens: list[np.ndarray]  # the generated ids of each prompt (up to and without EOS)
    seconds: float  # wall time of the generation, compile included on a first call
    speculative: dict | None = None  # speculative decoding's statistics (`generate`'s stats)

    @property
    def tokens_per_second(self) -> float:
        return sum(len(t) for t in self.tokens) / max(self.seconds, 1e-9)


class _Continuation:
    """The text of tokens after a prompt: decoded behind the prompt and cut from it, as a
    tokenizer may spell a token differently at the start of a text (SentencePiece drops the
    space before a first word: "Hello" + "world", not "Hello world"). If the whole does not
    begin with the prompt's text, the tokens are decoded alone."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]):
        self.tokenizer, self.prompt_ids = tokenizer, [int(i) for i in prompt_ids]
        self.prompt = tokenizer.decode(self.prompt_ids)

    def __call__(self, ids: Sequence[int]) -> str:
        whole = self.tokenizer.decode([*self.prompt_ids, *(int(i) for i in ids)])
        if whole.startswith(self.prompt):
            return whole[len(self.prompt):]
        return self.tokenizer.decode(ids)


class _Streamer:
    """Host side of the decode loop: decodes each row as it grows (after its prompt's ids,
    `_Continuation`; none given: empty), reports new text and stops rows whose text reached a
    stop string."""

    def __init__(self, tokenizer: Tokenizer, batch: int, stop: Sequence[str],
                 eos: Sequence[int], on_text: Callable[[int, str], None] | None,
                 prompt_ids: Sequence[Sequence[int]] | None = None):
        self.stop, self.eos, self.on_text = tuple(stop), eos, on_text
        self.decode = [_Continuation(tokenizer, ids) for ids in prompt_ids or [[]] * batch]
        self.ids: list[list[int]] = [[] for _ in range(batch)]
        self.shown = [""] * batch
        self.stopped = np.zeros(batch, bool)

    def __call__(self, position, tokens_B, new_B) -> np.ndarray:
        for row in np.flatnonzero(np.asarray(new_B) & ~self.stopped):
            if int(tokens_B[row]) in self.eos:
                self.stopped[row] = True
                continue
            self.ids[row].append(int(tokens_B[row]))
            full = self.decode[row](self.ids[row])
            text = cut_at_stop(full, self.stop)
            self.stopped[row] = len(text) < len(full)
            # Show only text that can no longer turn into a stop string or change (an
            # incomplete UTF-8 sequence decodes as U+FFFD until its last byte arrives: one in
            # all, or one a byte with SentencePiece's byte fallback).
            held = 0 if self.stopped[row] else max((len(s) - 1 for s in self.stop), default=0)
            ready = text[:len(text) - held] if held else text
            ready = ready.rstrip("\ufffd")
            if self.on_text is not None and len(ready) > len(self.shown[row]):
                self.on_text(int(row), ready[len(self.shown[row]):])
                self.shown[row] = ready
        return self.stopped.copy()

    def flush(self, texts: Sequence[str]) -> None:
        if self.on_text is not None:
            for row, text in enumerate(texts):
                if len(text) > len(self.shown[row]):
                    self.on_text(row, text[len(self.shown[row]):])


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """`text` up to (without) the earliest stop string in it."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[:min(cuts)] if cuts else text


def generate_text(model: LanguageModel, tokenizer: Tokenizer, prompts: Sequence[str], *,
                  max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
                  top_p: float | None = None, seed: int = 0, stop: str | Sequence[str] = (),
                  eos_ids: Sequence[int] | None = None, max_positions: int | None = None,
                  on_text: Callable[[int, str], None] | None = None,
                  modes: Any = None, speculative: int | None = None) -> TextGeneration:
    """Continues each prompt (see the module docstring).

    `stop`: a stop string or several. `eos_ids`: the ids that end a row (default: the
    tokenizer's EOS). `max_positions`: the model's position limit (e.g. a Hugging Face model's
    max_position_embeddings); a prompt that leaves no room for `max_new_tokens` is an error.
    `on_text(row, text)` receives each row's text as it is generated (streaming). `modes`: an
    Oryx mode schedule; `speculative`: Oryx self-speculative decoding with this many drafts
    (`generate`; its statistics in `TextGeneration.speculative`).
    """
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    stop = [stop] if isinstance(stop, str) else list(stop)  # one string is one stop string
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
    ids = [tokenizer.encode_prompt(p) for p in prompts]
    empty = [i for i, x in enumerate(ids) if len(x) == 0]
    if empty:
        raise ValueError(f"prompt {empty[0]} encodes to no tokens: give some text")
    lengths = np.array([len(x) for x in ids])
    too_big = [int(x.max()) for x in ids if x.max() >= model.config.vocab_size]
    if too_big:
        raise ValueError(f"tokenizer id {too_big[0]} is outside the model's vocab_size="
                         f"{model.config.vocab_size}: is it the run's tokenizer?")
    prompt_BT = np.zeros((len(ids), lengths.max()), np.int32)
    for row, x in enumerate(ids):
        prompt_BT[row, :len(x)] = x
    eos = [tokenizer.eos_id] if eos_ids is None else list(eos_ids)
    streamer = _Streamer(tokenizer, len(ids), stop, eos, on_text, ids)
    start = time.perf_counter()
    stats = {}
    out = np.asarray(generate(model, prompt_BT, max_new_tokens, temperature=temperature,
                              top_k=top_k, top_p=top_p, seed=seed, lengths=lengths,
                              eos_id=eos[0] if len(eos) == 1 else None, modes=modes,
                              max_positions=max_positions, speculative=speculative, stats=stats,
                              on_tokens=streamer if stop or on_text or len(eos) > 1 else None))
    seconds = time.perf_counter() - start
    tokens, texts = [], []
    for row, decode in zip(out, streamer.decode, strict=True):
        # -1 fills a row that the streamer stopped when the loop had no single EOS id
        ends = [i for i, t in enumerate(row) if t in eos or t < 0]
        row = row[:ends[0]] if ends else row
        text = decode(row)
        cut = cut_at_stop(text, stop)
        if len(cut) < len(text):  # keep the ids up to the stop string's
            row = row[:next(i for i in range(len(row) + 1) if len(decode(row[:i])) >= len(cut))]
        tokens.append(row)
        texts.append(cut)
    streamer.flush(texts)
    return TextGeneration(texts, tokens, seconds, stats or None)
