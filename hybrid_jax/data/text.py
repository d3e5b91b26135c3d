"""The `text` data kind: language modelling on the user's files (text, ArrayRecord, tokens).

    --set data.path=../shared/data/wikitext-2-raw/wiki.train.raw
    --set data.eval_path=../shared/data/wikitext-2-raw/wiki.valid.raw
    --set data.tokenizer=bpe:8192        # byte (default) | bpe:VOCAB | word | path/tokenizer.json

`TextConfig` is the frozen config; `TextConfig.bind(run_dir)` resolves the tokenizer (training a
BPE or word vocabulary on `path` when asked, reusing the one recorded in the run directory when
resuming), records it as `RUN_DIR/tokenizer.json` and returns a `TextData`, whose
`source(split, seed)` feeds the grain pipeline and whose `eval_batches` cover the held-out file.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hybrid_jax.config import register_data
from hybrid_jax.data.corpus import (
    TokenStream,
    document_pieces,
    file_kind,
    load_stream,
    resolve_files,
)
from hybrid_jax.data.packing import PackedWindows
from hybrid_jax.data.tokenizer import (
    EOS,
    MIN_BPE_VOCAB,
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    WordTokenizer,
    build_word_vocab,
    load_tokenizer,
    tokenizer_fingerprint,
    train_bpe,
)
from hybrid_jax.distributed import is_main_process

TOKENIZER_FILE = "tokenizer.json"
TOKEN_DTYPES = ("uint16", "uint32", "int32")


@register_data("text")
@dataclasses.dataclass(frozen=True)
class TextConfig:
    path: str = ""  # training files: paths or globs, comma-separated
    eval_path: str = ""  # held-out files (loss, perplexity, bits-per-byte)
    tokenizer: str = "byte"  # byte | bpe:VOCAB (>= 258, trained on `path`) | word | tokenizer.json
    seq_len: int = 256
    document_regex: str = ""  # a line matching this starts a document; "": one per file
    token_dtype: str = "uint16"  # element type of raw .bin token files
    word_perplexity: bool = False  # also report word-level perplexity (WikiText)
    cache_dir: str = ""  # tokenized-data cache; "": RUN_DIR/data_cache
    encoding: str = "utf-8"  # of the text files (any Python codec name, e.g. latin-1)

    def __post_init__(self) -> None:
        name = "TextConfig"
        if self.seq_len < 1:
            raise ValueError(f"{name}.seq_len={self.seq_len}: expected a positive integer")
        if self.token_dtype not in TOKEN_DTYPES:
            raise ValueError(f"{name}.token_dtype={self.token_dtype!r}: expected one of "
                             f"{list(TOKEN_DTYPES)}")
        _bpe_vocab(self.tokenizer)
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ValueError(f"{name}.encoding={self.encoding!r}: not a known text encoding "
                             "(e.g. utf-8, latin-1, cp1252, utf-16)") from None
        try:
            re.compile(self.document_regex)
        except re.error as e:
            raise ValueError(f"{name}.document_regex={self.document_regex!r}: {e}") from None

    def bind(self, run_dir: str | Path | None = None, *, resume: bool = False) -> TextData:
        run_dir = None if run_dir is None else Path(run_dir)
        tokenizer = resolve_tokenizer(self, run_dir, resume=resume)
        cache = Path(self.cache_dir) if self.cache_dir else (
            None if run_dir is None else run_dir / "data_cache")
        return TextData(self, tokenizer, cache)


def _bpe_vocab(spec: str) -> int | None:
    """The vocabulary size of a "bpe:N" spec (None for other specs); checks the spec's form."""
    if spec.startswith("bpe:"):
        try:
            vocab = int(spec[4:])
        except ValueError:
            pass
        else:
            if vocab < MIN_BPE_VOCAB:
                raise ValueError(f"TextConfig.tokenizer={spec!r}: a byte-level BPE needs a "
                                 f"vocabulary of at least {MIN_BPE_VOCAB} (256 bytes, {EOS} "
                                 "and a merge)")
            return vocab
    elif spec in ("byte", "word") or spec.endswith(".json"):
        return None
    raise ValueError(f"TextConfig.tokenizer={spec!r}: expected 'byte', 'bpe:VOCAB_SIZE' "
                     "(e.g. bpe:8192), 'word' or the path of a tokenizer.json")


def corpus_texts(files: list[Path], document_regex: str = "", encoding: str = "utf-8", *,
                 option: str = "data.encoding") -> Iterator[str]:
    """The text of `files` in pieces (text or ArrayRecord), for training a tokenizer; `option`:
    how the caller sets `encoding` (`document_pieces`)."""
    for path in files:
        if file_kind(path) == "tokens":
            raise ValueError(f"cannot train a tokenizer on token file {path}: give text files")
        for _, text in document_pieces(path, document_regex, encoding, option=option):
            yield text


def resolve_tokenizer(config: TextConfig, run_dir: Path | None, *,
                      resume: bool = False) -> Tokenizer:
    """The tokenizer `config.tokenizer` names, recorded as `run_dir/tokenizer.json`.

    When resuming, the recorded one is used. A "bpe:N" or "word" run reuses a recorded tokenizer
    of that kind (e.g. from `hybrid-jax tokenizer train --out RUN_DIR`) or trains one on `path`.
    """
    recorded = None if run_dir is None else run_dir / TOKENIZER_FILE
    if resume and recorded is not None and recorded.is_file():
        return load_tokenizer(recorded)
    previous = load_tokenizer(recorded) if recorded is not None and recorded.is_file() else None
    spec, vocab = config.tokenizer, _bpe_vocab(config.tokenizer)
    if spec == "byte":
        tokenizer: Tokenizer = ByteTokenizer()
    elif vocab is not None:
        if isinstance(previous, HFTokenizer) and previous.vocab_size == vocab:
            tokenizer = previous
        else:
            texts = corpus_texts(resolve_files(config.path, "data.path"), config.document_regex,
                                 config.encoding)
            tokenizer = train_bpe(texts, vocab)
    elif spec == "word":
        if isinstance(previous, WordTokenizer):
            tokenizer = previous
        else:
            texts = corpus_texts(resolve_files(config.path, "data.path"), config.document_regex,
                                 config.encoding)
            tokenizer = build_word_vocab(texts)
    else:
        tokenizer = load_tokenizer(spec)
    # Process 0 only: every process of a multi-host run binds the data, and writers of one
    # file at once share its temporary file (`hybrid_jax.files.replacing`).
    if recorded is not None and is_main_process():
        tokenizer.save(recorded)
    return tokenizer


def check_put_tokenizer(config: TextConfig, run_dir: Path) -> None:
    """Refuses a fresh run in `run_dir` whose `config.tokenizer` would replace the
    `tokenizer.json` put there for it (`hybrid-jax tokenizer train --out RUN_DIR`: a BPE may
    take long to train) by another: `resolve_tokenizer` reuses it only when the spec names it."""
    recorded = run_dir / TOKENIZER_FILE
    if not recorded.is_file():
        return
    previous, spec = load_tokenizer(recorded), config.tokenizer
    vocab = _bpe_vocab(spec)
    if spec == "byte":
        kept = isinstance(previous, ByteTokenizer)
    elif vocab is not None:
        kept = isinstance(previous, HFTokenizer) and previous.vocab_size == vocab
    elif spec == "word":
        kept = isinstance(previous, WordTokenizer)
    else:  # a path (one that does not exist is refused when the data binds)
        kept = not Path(spec).is_file() or (tokenizer_fingerprint(load_tokenizer(spec))
                                            == tokenizer_fingerprint(previous))
    if not kept:
        raise ValueError(f"{recorded} holds a tokenizer of {previous.vocab_size} tokens that "
                         f"data.tokenizer={spec!r} does not name and would replace: train with "
                         f"it (--set data.tokenizer={recorded} --set model.vocab_size="
                         f"{previous.vocab_size}), or pass --force to replace it, or choose "
                         "another --out")


def _warn_on_shared_files(eval_files: list[Path], train_spec: str) -> None:
    """Held-out numbers measured on training text look better than they are: say so."""
    try:
        train = {f.resolve() for f in resolve_files(train_spec, "data.path")}
    except (FileNotFoundError, ValueError):  # evaluating without the training files at hand
        return
    shared = [str(f) for f in eval_files if f.resolve() in train]
    if shared:
        logging.getLogger("hybrid_jax.data").warning(
            "data.eval_path and data.path share %d file(s), e.g. %s: the eval loss is measured "
            "on training text", len(shared), shared[0])


@dataclasses.dataclass
class TextData:
    """A bound text config: the tokenizer plus token streams of the train and eval files."""

    config: TextConfig
    tokenizer: Tokenizer
    cache_dir: Path | None
    _streams: dict[str, TokenStream] = dataclasses.field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def stream(self, split: str) -> TokenStream:
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'eval'")
        if split not in self._streams:
            spec, what = ((self.config.path, "data.path") if split == "train"
                          else (self.config.eval_path, "data.eval_path"))
            files = resolve_files(spec, what)
            if split == "eval":
                _warn_on_shared_files(files, self.config.path)
            self._streams[split] = load_stream(
                files, self.tokenizer,
                document_regex=self.config.document_regex, token_dtype=self.config.token_dtype,
                cache_dir=self.cache_dir, encoding=self.config.encoding)
        return self._streams[split]

    def source(self, split: str, seed: int = 0) -> PackedWindows:
        """Training windows (whole ones), or eval windows (the last one padded, with bytes)."""
        if split == "train":
            return PackedWindows(self.stream(split), self.seq_len,
                                 where=f"data.path={self.config.path!r}")
        return PackedWindows(self.stream(split), self.seq_len, pad_last=True,
                             token_bytes=self.tokenizer.token_bytes(),
                             where=f"data.eval_path={self.config.eval_path!r}")

    def eval_batches(self, batch_size: int, num_batches: int = 0) -> list[dict[str, np.ndarray]]:
        """The first `num_batches` batches of held-out windows in order (0: all of them); the
        last batch is padded with unscored rows."""
        source = self.source("eval")
        count = -(-len(source) // batch_size)
        count = count if num_batches == 0 else min(count, num_batches)
        batches = []
        for b in range(count):
            rows = [source[i] for i in range(b * batch_size, min((b + 1) * batch_size,
                                                                 len(source)))]
            rows += [{k: np.zeros_like(v) for k, v in rows[0].items()}] * (batch_size - len(rows))
            batches.append({k: np.stack([r[k] for r in rows]) for k in rows[0]})
        return batches

    def eval_words(self, batches: list[dict[str, np.ndarray]]) -> int | None:
        """Words of the held-out text when `batches` score all of it and word perplexity is on."""
        stream = self.stream("eval")
        scored = sum(int(b["mask"].sum()) for b in batches)
        if not self.config.word_perplexity or stream.num_words < 0 or scored < len(stream) - 1:
            return None
        return stream.num_words
