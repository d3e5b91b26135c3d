"""Tokenizers for text data: bytes (built in), byte-level BPE and words (`tokenizers` library).

Every tokenizer has `vocab_size`, `eos_id` (the document separator), `encode(text)` → int32
ids, `encode_batch(texts)`, `decode(ids)`, `token_bytes()` (UTF-8 bytes each id stands for, 0 for
special tokens; bits-per-byte counts bytes through it), `to_json()` and `save(path)`, which
writes a `tokenizer.json` that `load_tokenizer` reads back. Byte-level tokenizers round-trip
any text exactly; the word tokenizer (WikiText word level) maps each newline to `<eos>` and
loses spacing.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hybrid_jax.files import write_atomic

EOS = "<|endoftext|>"
MIN_BPE_VOCAB = 258  # 256 byte tokens, EOS and at least one merge
WORD_EOS, WORD_UNK = "<eos>", "<unk>"
# Our own tokenizer.json files say which kind they are under this key; others are HF files.
KIND_KEY = "hybrid_jax_tokenizer"
# Files beside a Hugging Face tokenizer.json that may name its end-of-sequence token.
HF_TOKENIZER_CONFIG = "tokenizer_config.json"  # eos_token
HF_GENERATION_CONFIG = "generation_config.json"  # eos_token_id
HF_MODEL_CONFIG = "config.json"  # eos_token_id (in a run directory: the experiment, without it)
HF_RUN_MODEL_CONFIG = "hf_config.json"  # an imported model's config.json, in its run directory
# How the usual tokenizers spell EOS (Llama 2 / Mistral, GPT-2 / Qwen2 / ours, Llama 3, Gemma).
EOS_SPELLINGS = ("</s>", EOS, "<|end_of_text|>", "<eos>")
BYTE_FALLBACK_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's tokens of one byte


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> np.ndarray: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    def encode_prompt(self, text: str) -> np.ndarray:
        """Ids of a generation prompt: `encode` plus the special tokens that the tokenizer's
        template adds (a Llama tokenizer's BOS)."""
        ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_bytes(self) -> np.ndarray: ...

    def to_json(self) -> str: ...

    def save(self, path: str | Path) -> None: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; id 256 is the end-of-document token."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    encode_prompt = encode

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(i for i in checked_ids(ids, self.vocab_size, self.name) if i < 256)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        return np.array([1] * 256 + [0], np.int32)

    def to_json(self) -> str:
        return json.dumps({KIND_KEY: "byte", "vocab_size": self.vocab_size, "eos": EOS})

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())


class HFTokenizer:
    """A `tokenizers.Tokenizer` (e.g. the byte-level BPE of `train_bpe`, or a user's file).

    `eos` is the end-of-document token (a Hugging Face model's, from its
    `tokenizer_config.json`, e.g. "</s>"); our BPE's is "<|endoftext|>".
    """

    def __init__(self, tokenizer: Any, name: str = "bpe", eos: str = EOS):
        self.tokenizer = tokenizer
        # Text that happens to contain "<|endoftext|>" is encoded as text, never as the special.
        tokenizer.encode_special_tokens = True
        self.name = name
        # The largest id + 1: a tokenizer.json may number its tokens with gaps, and a count of
        # them would let ids past it wrap in a uint16 token file and pass the model's check.
        self.vocab_size = max(tokenizer.get_vocab_size(),
                              max(tokenizer.get_vocab().values(), default=-1) + 1)
        eos_id = tokenizer.token_to_id(eos)
        if eos_id is None:
            raise ValueError(f"tokenizer {name!r} has no {eos!r} token (the document separator); "
                             f"train one with `hybrid-jax tokenizer train`")
        self.eos, self.eos_id = eos, eos_id

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def encode_prompt(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=True).ids, np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(checked_ids(ids, self.vocab_size, self.name))

    def token_bytes(self) -> np.ndarray:
        """Byte-level vocabularies spell each byte as one character: exact. Others (SentencePiece
        style: "▁" for a space, `<0xNN>` byte tokens) decode each token after another one, as a
        lone token's decode drops the space before a word and turns a byte into U+FFFD; the
        space such a tokenizer prepends to each text counts one byte more than the text has."""
        specials = {t.content for t in self.tokenizer.get_added_tokens_decoder().values()
                    if t.special}
        config = json.loads(self.tokenizer.to_str())
        byte_level = (config.get("decoder") or {}).get("type") == "ByteLevel"
        byte_fallback = (config.get("model") or {}).get("byte_fallback", False)
        tokens = [(t, i) for t, i in self.tokenizer.get_vocab().items() if t not in specials]
        sizes = np.zeros(self.vocab_size, np.int32)
        if byte_level:
            for token, i in tokens:
                sizes[i] = len(token)
            return sizes
        anchor = next(i for _, i in sorted(tokens, key=lambda ti: ti[1]) if self.decode([i]))
        anchor_bytes = len(self.decode([anchor]).encode("utf-8"))
        texts = self.tokenizer.decode_batch([[anchor, i] for _, i in tokens])
        for (token, i), text in zip(tokens, texts, strict=True):
            one_byte = byte_fallback and BYTE_FALLBACK_TOKEN.fullmatch(token)
            sizes[i] = 1 if one_byte else len(text.encode("utf-8")) - anchor_bytes
        return sizes

    def to_json(self) -> str:
        return self.tokenizer.to_str(pretty=True)

    def save(self, path: str | Path) -> None:
        """Writes `path` and, unless the files beside it already name this EOS to
        `load_tokenizer` (`hf_eos`: our BPE's only special token needs none), the `eos_token` of
        a tokenizer_config.json there (its other settings kept): the tokenizer.json alone does
        not say which of several special tokens separates documents."""
        path = Path(path)
        write_atomic(path, self.to_json())
        try:
            found = hf_eos(path, self.tokenizer, warn=False)
        except ValueError:  # no EOS to tell (or a config beside that is not JSON: named below)
            found = None
        if found != self.eos:
            config = _json_beside(path, HF_TOKENIZER_CONFIG)
            write_atomic(path.with_name(HF_TOKENIZER_CONFIG),
                         json.dumps({**config, "eos_token": self.eos}, indent=2))


class WordTokenizer:
    """Whitespace-separated words, `<eos>` for each newline, `<unk>` for unknown words.

    `encode("a b\\nc\\n")` is `[a, b, <eos>, c, <eos>]`: WikiText-2's word-level convention.
    """

    name = "word"

    def __init__(self, vocab: Sequence[str]):
        if list(vocab[:2]) != [WORD_EOS, WORD_UNK]:
            raise ValueError(f"a word vocabulary starts with {[WORD_EOS, WORD_UNK]}, "
                             f"got {list(vocab[:2])}")
        self.vocab = list(vocab)
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        if len(self.ids) < len(self.vocab):
            twice = next(w for w, n in collections.Counter(self.vocab).items() if n > 1)
            raise ValueError(f"a word vocabulary lists each word once, got {twice!r} twice "
                             f"(or more) in {len(self.vocab)} words")
        self.vocab_size, self.eos_id = len(self.vocab), 0

    def encode(self, text: str) -> np.ndarray:
        ids, unk = [], self.ids[WORD_UNK]
        lines = text.split("\n")
        for n, line in enumerate(lines):
            ids.extend(self.ids.get(w, unk) for w in line.split())
            if n < len(lines) - 1:
                ids.append(self.eos_id)
        return np.asarray(ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    encode_prompt = encode

    def decode(self, ids: Iterable[int]) -> str:
        lines, line = [], []
        for i in checked_ids(ids, self.vocab_size, self.name):
            if i == self.eos_id:
                lines.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(self.vocab[i])
        return "".join(lines) + " ".join(line)

    def token_bytes(self) -> np.ndarray:
        # A word and the separator after it; <eos> is the newline.
        return np.array([1, len(WORD_UNK) + 1] + [len(w.encode()) + 1 for w in self.vocab[2:]],
                        np.int32)

    def to_json(self) -> str:
        return json.dumps({KIND_KEY: "word", "vocab": self.vocab}, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())


def checked_ids(ids: Iterable[int], vocab_size: int, name: str) -> list[int]:
    """`ids` as ints; an id outside `[0, vocab_size)` raises ValueError naming it."""
    out = [int(i) for i in ids]
    bad = [i for i in out if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"cannot decode token id {bad[0]} with tokenizer {name!r}: expected "
                         f"ids in [0, {vocab_size})")
    return out


def train_bpe(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> HFTokenizer:
    """A byte-level BPE (GPT-2 style pre-splitting, no normalisation: round-trips exactly)."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(f"a byte-level BPE needs vocab_size >= {MIN_BPE_VOCAB} (256 bytes, "
                         f"{EOS} and a merge), got {vocab_size}")
    tokenizer = HF(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    if tokenizer.get_vocab_size() < vocab_size:  # the text has no more pairs to merge
        logging.getLogger("hybrid_jax.tokenizer").warning(
            "the BPE has %d tokens of the %d asked for: the text holds no more pairs seen %d "
            "times (model.vocab_size=%d would do)", tokenizer.get_vocab_size(), vocab_size,
            min_frequency, tokenizer.get_vocab_size())
    return HFTokenizer(tokenizer)


def build_word_vocab(texts: Iterable[str], vocab_size: int | None = None) -> WordTokenizer:
    """The whitespace-separated words of `texts`, most frequent first (ties by first use):
    all of them, or the `vocab_size − 2` most frequent (the others read as `<unk>`)."""
    specials = (WORD_EOS, WORD_UNK)
    if vocab_size is not None and not (isinstance(vocab_size, int) and vocab_size > len(specials)):
        raise ValueError(f"a word vocabulary needs vocab_size > {len(specials)} ({WORD_EOS}, "
                         f"{WORD_UNK} and a word), got {vocab_size!r}")
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        counts.update(text.split())
    for special in specials:
        counts.pop(special, None)
    top = None if vocab_size is None else vocab_size - len(specials)
    return WordTokenizer([*specials, *(w for w, _ in counts.most_common(top))])


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Reads a `tokenizer.json`: ours (byte, word) or any `tokenizers` library file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"tokenizer file {path} is not valid JSON: {e}") from None
    kind = data.get(KIND_KEY) if isinstance(data, dict) else None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "word":
        vocab = data.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
            raise ValueError(f"tokenizer file {path}: a word tokenizer needs \"vocab\", a list "
                             f"of words; found {type(vocab).__name__}")
        return WordTokenizer(vocab)
    if kind is not None:
        raise ValueError(f"tokenizer file {path}: unknown {KIND_KEY} {kind!r}; "
                         "expected 'byte' or 'word'")
    from tokenizers import Tokenizer as HF

    try:
        tokenizer = HF.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception for malformed files
        raise ValueError(f"tokenizer file {path} could not be loaded: {e}") from None
    return HFTokenizer(tokenizer, name=str(path), eos=hf_eos(path, tokenizer))


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """SHA-256 of the tokenizer's JSON: checkpoints record it, restores compare it."""
    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


def hf_eos(path: Path, tokenizer: Any, *, warn: bool = True) -> str:
    """The end-of-sequence token of the Hugging Face tokenizer `tokenizer` read from `path`.

    In order: `eos_token` of tokenizer_config.json beside `path`; `eos_token_id` (the first,
    if a list) of generation_config.json, config.json or hf_config.json there; the tokenizer's
    only special token (our BPE files: `<|endoftext|>`); its one special token spelled as a
    usual EOS (`EOS_SPELLINGS`, with a warning unless not `warn`). Anything else raises
    ValueError: no guess.
    """
    config = _json_beside(path, HF_TOKENIZER_CONFIG)
    eos = config.get("eos_token")
    if eos:
        return eos["content"] if isinstance(eos, dict) else eos
    for name in (HF_GENERATION_CONFIG, HF_MODEL_CONFIG, HF_RUN_MODEL_CONFIG):
        eos_id = _json_beside(path, name).get("eos_token_id")
        eos_id = eos_id[0] if isinstance(eos_id, list) and eos_id else eos_id
        if isinstance(eos_id, int) and not isinstance(eos_id, bool):
            token = tokenizer.id_to_token(eos_id)
            if token is None:
                raise ValueError(f"{path.with_name(name)}: eos_token_id {eos_id} is not a token "
                                 f"of {path} ({tokenizer.get_vocab_size()} tokens)")
            return token
    specials = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values()
                      if t.special)
    if len(specials) == 1:
        return specials[0]
    named = [t for t in specials if t in EOS_SPELLINGS]
    if len(named) == 1:
        if warn:
            logging.getLogger("hybrid_jax.tokenizer").warning(
                "%s: no file beside it names the end-of-sequence token; using its special "
                "token %r (add %s with \"eos_token\" to choose another)", path, named[0],
                HF_TOKENIZER_CONFIG)
        return named[0]
    raise ValueError(
        f"{path}: cannot tell its end-of-sequence token: no {HF_TOKENIZER_CONFIG} with "
        f"\"eos_token\", no eos_token_id in {HF_GENERATION_CONFIG} / {HF_MODEL_CONFIG} beside "
        f"it, and its special tokens {specials[:8]} hold "
        f"{'none' if not named else 'several'} of {list(EOS_SPELLINGS)}; add "
        f"{HF_TOKENIZER_CONFIG} with {{\"eos_token\": ...}}")


def _json_beside(path: Path, name: str) -> dict[str, Any]:
    """The JSON object in file `name` next to `path` ({} when there is none)."""
    other = path.with_name(name)
    if not other.is_file():
        return {}
    try:
        data = json.loads(other.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{other} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}
