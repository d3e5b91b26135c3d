"""Corpora as token streams: the documents of a set of files, tokenized and concatenated.

Inputs (one kind per file list, chosen by extension):
- text: `.txt`, `.raw`, `.tokens`, ... and `.gz` / `.xz` / `.bz2` compressed, read as streams of
  lines in `encoding` (UTF-8 by default); other compressions (`.zst`, `.zip`, ...) are refused.
  A line matching `document_regex` starts a new document; without one, each file is a document.
  Bytes that do not decode, NUL bytes (binary files) and damaged compressed streams raise
  ValueError naming the file and line.
- ArrayRecord (`.arrayrecord`, `.array_record`): one UTF-8 document per record.
- token arrays: `.npy` (memory-mapped) or raw `.bin` (`token_dtype`), already tokenized;
  documents start at each end-of-document id.

A `TokenStream` puts the end-of-document id *before* every document, so the first token of each
document is predicted from a fresh context and the last one predicts the separator. Tokenized
text is cached on disk (keyed by files, sizes, modification times, tokenizer, its EOS and
document rule) and memory-mapped, so a restarted run does not tokenize again.
"""

from __future__ import annotations

import bz2
import codecs
import dataclasses
import glob
import gzip
import hashlib
import json
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from hybrid_jax.data.tokenizer import Tokenizer
from hybrid_jax.files import new_temporary, replacing

TOKEN_SUFFIXES = (".npy", ".bin")
ARRAY_RECORD_SUFFIXES = (".arrayrecord", ".array_record")
PIECE_CHARS = 1 << 20  # text is tokenized in pieces of about this many characters, cut at lines
CACHE_VERSION = 2  # 2: a UTF-8 byte order mark is no text
DECOMPRESSORS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
# Compressions without a decompressor in the standard library: their bytes are no text.
UNREADABLE_COMPRESSIONS = (".zst", ".zstd", ".zip", ".lz4", ".7z", ".br")


class ConcatenatedTokens:
    """Token arrays back to back, read in place: memory-mapped shards stay on disk (one
    concatenated array would hold them all in memory). Has `len`, contiguous slices (what
    packing reads) and `np.asarray`."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.ends = np.cumsum([len(a) for a in arrays])
        self.dtype = np.result_type(*arrays)

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError(f"token shards are read in contiguous slices, got step {step}")
        parts = [np.zeros(0, self.dtype)]  # the result's dtype, and an empty slice's
        for i in range(int(np.searchsorted(self.ends, start, side="right")), len(self.arrays)):
            begin = int(self.ends[i]) - len(self.arrays[i])
            if begin >= stop:
                break
            parts.append(self.arrays[i][max(start - begin, 0):stop - begin])
        return np.concatenate(parts)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.concatenate(self.arrays).astype(dtype or self.dtype, copy=False)


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """`tokens[N]` (documents back to back; an array, or the shards of several token files)
    and `doc_starts[D]` (offset of each document).

    `num_words`: whitespace-separated words plus one per line of the text (the WikiText
    word-level count), -1 when unknown (token files).
    """

    tokens: np.ndarray | ConcatenatedTokens
    doc_starts: np.ndarray
    num_words: int = -1

    def __len__(self) -> int:
        return len(self.tokens)


def resolve_files(spec: str, what: str, *, option: str | None = None) -> list[Path]:
    """Files named by `spec`: paths and globs, comma-separated; missing ones raise, naming them.
    `option`: how a command line gives `what`, for the examples in errors (default
    `--set WHAT=`; "" for a positional argument, e.g. `hybrid-jax tokenizer train FILES`)."""
    option = f"--set {what}=" if option is None else option
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{what} is empty: set it to a file, a glob or a comma-separated list, "
                         f"e.g. {option}corpus/*.txt")
    files: list[Path] = []
    for part in parts:
        pattern = os.path.expanduser(part)
        if glob.has_magic(pattern):
            matches = sorted(Path(m) for m in glob.glob(pattern) if Path(m).is_file())
            if not matches:
                raise FileNotFoundError(f"{what}={part!r} matches no file (from {os.getcwd()})")
            files.extend(matches)
        elif Path(pattern).is_file():
            files.append(Path(pattern))
        elif Path(pattern).is_dir():  # "not found" misled: it is there
            raise ValueError(f"{what}={part!r} is a directory: give its files, e.g. "
                             f"{option}{os.path.join(part, '*.txt')}")
        else:
            raise FileNotFoundError(f"{what}: data file {part} not found (from {os.getcwd()})")
    return files


def file_kind(path: Path) -> str:
    """"tokens", "arrayrecord" or "text", by extension."""
    name = path.name.lower()
    if name.endswith(TOKEN_SUFFIXES):
        return "tokens"
    if name.endswith(ARRAY_RECORD_SUFFIXES):
        return "arrayrecord"
    return "text"


def open_text(path: Path, encoding: str = "utf-8") -> IO[str]:
    """A text stream of `path`, decompressing `.gz` / `.xz` / `.bz2` on the fly; newlines
    untranslated; undecodable bytes raise; a leading UTF-8 byte order mark is dropped."""
    suffix = path.suffix.lower()
    if suffix in UNREADABLE_COMPRESSIONS:  # else "not valid utf-8: set data.encoding" misleads
        raise ValueError(f"data file {path}: {suffix} compression cannot be read; decompress it "
                         f"or compress it as {', '.join(DECOMPRESSORS)}")
    if codecs.lookup(encoding).name == "utf-8":
        encoding = "utf-8-sig"  # the same text, less a byte order mark (Windows editors add one)
    opener = DECOMPRESSORS.get(suffix, open)
    return opener(path, "rt", encoding=encoding, errors="strict", newline="")


def _checked_lines(path: Path, encoding: str, option: str) -> Iterator[str]:
    """The lines of a text file; a decoding error, a NUL byte or a damaged compressed stream
    raises ValueError naming the file and line (and `option`, the caller's name for the
    encoding: `data.encoding`, or `--encoding` of `hybrid-jax tokenizer train`)."""
    number = 0
    try:
        with open_text(path, encoding) as f:
            for number, line in enumerate(f, 1):  # noqa: B007 (read in the except clauses)
                if "\0" in line:
                    raise ValueError(
                        f"data file {path} looks binary (a NUL byte on line {number}): give "
                        "text, ArrayRecord (.arrayrecord) or token (.npy, .bin) files, or set "
                        f"{option} (e.g. utf-16) if it is text")
                yield line
    except UnicodeDecodeError as e:
        raise ValueError(f"data file {path} is not valid {encoding} text (near line "
                         f"{number + 1}: {e.reason}): set {option} to its "
                         f"encoding (e.g. {_likely_encodings(path)})") from None
    except (EOFError, OSError, lzma.LZMAError, zlib.error) as e:  # bz2: OSError
        if path.suffix.lower() not in DECOMPRESSORS:
            raise
        raise ValueError(f"data file {path} is a damaged {path.suffix} stream (after line "
                         f"{number}): {e}") from None


def _likely_encodings(path: Path) -> str:
    """What to suggest for a file that is not valid text in the encoding asked for: UTF-16
    where it starts with that byte order mark (else the hint named latin-1 for it)."""
    with DECOMPRESSORS.get(path.suffix.lower(), open)(path, "rb") as f:
        start = f.read(2)
    return "utf-16" if start in (b"\xff\xfe", b"\xfe\xff") else "latin-1, cp1252"


def document_pieces(path: Path, document_regex: str = "", encoding: str = "utf-8", *,
                    option: str = "data.encoding") -> Iterator[tuple[bool, str]]:
    """`(starts_document, text)` pieces of a text or ArrayRecord file; `option`: how the caller
    sets `encoding`, for the errors' hints."""
    if file_kind(path) == "arrayrecord":
        return array_record_pieces(path, encoding, option=option)
    return text_pieces(path, document_regex, encoding, option=option)


def text_pieces(path: Path, document_regex: str = "", encoding: str = "utf-8", *,
                option: str = "data.encoding") -> Iterator[tuple[bool, str]]:
    """`(starts_document, text)` pieces of a text file, each at most ~1M characters (cut at line
    ends, so a file never sits whole in memory)."""
    starts = re.compile(document_regex) if document_regex else None
    lines: list[str] = []
    size, new_document = 0, True
    for line in _checked_lines(path, encoding, option):
        if starts is not None and starts.match(line.rstrip("\r\n")):
            if lines:
                yield new_document, "".join(lines)
                lines, size = [], 0
            new_document = True
        lines.append(line)
        size += len(line)
        if size >= PIECE_CHARS:
            yield new_document, "".join(lines)
            lines, size, new_document = [], 0, False
    if lines:
        yield new_document, "".join(lines)


def array_record_pieces(path: Path, encoding: str = "utf-8", *, option: str = "data.encoding"
                        ) -> Iterator[tuple[bool, str]]:
    """One document per record (text in `encoding`)."""
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        for start in range(0, reader.num_records(), 1024):
            records = reader.read(range(start, min(start + 1024, reader.num_records())))
            for index, record in enumerate(records, start):
                try:
                    text = record.decode(encoding)
                except UnicodeDecodeError as e:
                    raise ValueError(f"data file {path}: record {index} is not valid {encoding} "
                                     f"text ({e.reason} at byte {e.start}): set {option}"
                                     ) from None
                yield True, text
    finally:
        reader.close()


def count_words(text: str) -> int:
    """Whitespace-separated words plus one per newline (WikiText's one `<eos>` per line)."""
    return len(text.split()) + text.count("\n")


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class _StreamWriter:
    """Appends documents to a token stream, in memory or to a `.bin` file under `path`."""

    def __init__(self, dtype: np.dtype, path: Path | None):
        self.dtype, self.path = dtype, path
        self.chunks: list[np.ndarray] = []
        self.file = None if path is None else _temporary_beside(path.with_suffix(".bin"))
        self.length, self.doc_starts, self.num_words = 0, [], 0

    def write(self, ids: np.ndarray, new_document: bool, eos_id: int) -> None:
        if new_document:
            self.doc_starts.append(self.length)
            ids = np.concatenate([[eos_id], ids])
        ids = np.asarray(ids, self.dtype)
        if self.file is None:
            self.chunks.append(ids)
        else:
            ids.tofile(self.file)
        self.length += len(ids)

    def discard(self) -> None:
        """Removes the partial `.bin` of a tokenization that failed (a bad record, an interrupt):
        a large corpus would otherwise leave gigabytes of `.tmp` behind on every failed try."""
        if self.file is not None:
            _remove(self.file)

    def finish(self) -> TokenStream:
        doc_starts = np.asarray(self.doc_starts, np.int64)
        if self.file is None:
            tokens = np.concatenate(self.chunks) if self.chunks else np.zeros(0, self.dtype)
            return TokenStream(tokens, doc_starts, self.num_words)
        self.file.close()
        path = self.path
        os.replace(self.file.name, path.with_suffix(".bin"))
        _write_replacing(path.with_suffix(".docs.npy"), lambda f: np.save(f, doc_starts))
        meta = {"dtype": self.dtype.name, "length": self.length, "num_words": self.num_words}
        # written last: marks the cache complete
        _write_replacing(path.with_suffix(".json"), lambda f: f.write(json.dumps(meta).encode()))
        return _load_cached(path)


def _temporary_beside(path: Path) -> IO[bytes]:
    """A new binary file of this writer's own next to `path`, to be renamed onto it: writers of
    one cache entry at once (the hosts of a run, parallel runs) never share a file; its mode
    is a plain write's (a shared cache stays readable by others)."""
    return open(new_temporary(path), "wb")  # closed by finish / discard


def _remove(file: IO[bytes]) -> None:
    file.close()
    os.unlink(file.name)


def _write_replacing(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    with replacing(path) as tmp, open(tmp, "wb") as f:
        write(f)


def _load_cached(path: Path) -> TokenStream | None:
    meta_path = path.with_suffix(".json")
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    tokens = (np.memmap(path.with_suffix(".bin"), dtype=meta["dtype"], mode="r")
              if meta["length"] else np.zeros(0, meta["dtype"]))
    return TokenStream(tokens, np.load(path.with_suffix(".docs.npy")), meta["num_words"])


def _cache_key(files: list[Path], tokenizer: Tokenizer, document_regex: str,
               encoding: str) -> str:
    stats = [(str(f.absolute()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    # The EOS too: one tokenizer.json may be read with another (a tokenizer_config.json beside
    # it names it), and the stream holds it before every document.
    blob = json.dumps([CACHE_VERSION, stats, tokenizer.to_json(), tokenizer.eos_id,
                       document_regex] + ([encoding] if encoding != "utf-8" else []))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def tokenize_documents(files: list[Path], tokenizer: Tokenizer, *, document_regex: str = "",
                       cache_dir: Path | None = None, encoding: str = "utf-8") -> TokenStream:
    """Tokenizes text or ArrayRecord `files` into one stream (cached under `cache_dir`)."""
    cache = None
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache = cache_dir / _cache_key(files, tokenizer, document_regex, encoding)
        cached = _load_cached(cache)
        if cached is not None:
            return cached
    writer = _StreamWriter(_token_dtype(tokenizer.vocab_size), cache)
    batch: list[tuple[bool, str]] = []

    def flush() -> None:
        for (new_document, _), ids in zip(batch, tokenizer.encode_batch([t for _, t in batch]),
                                          strict=True):
            writer.write(ids, new_document, tokenizer.eos_id)
        batch.clear()

    try:
        for path in files:
            for new_document, text in document_pieces(path, document_regex, encoding):
                writer.num_words += count_words(text)
                batch.append((new_document, text))
                if len(batch) >= 8:
                    flush()
        flush()
    except BaseException:
        writer.discard()
        raise
    return writer.finish()


def load_token_files(files: list[Path], *, eos_id: int, vocab_size: int,
                     token_dtype: str = "uint16") -> TokenStream:
    """Pre-tokenized arrays (`.npy` memory-mapped, `.bin` raw `token_dtype`), back to back
    (several stay memory-mapped: `ConcatenatedTokens`). A file that does not start with
    `eos_id` starts a document anyway; after another file, behind an `eos_id` put between
    them, as text documents are: the last token of a file predicts the end of its document,
    not the next file's first token."""
    arrays, doc_starts, offset = [], [], 0
    for path in files:
        if path.suffix.lower() == ".npy":
            try:
                tokens = np.load(path, mmap_mode="r")
            except ValueError as e:
                raise ValueError(f"token file {path} is not a valid .npy array: {e}") from None
        else:
            tokens = _raw_tokens(path, token_dtype)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"token file {path}: expected a 1-D integer array, found shape "
                             f"{tokens.shape} dtype {tokens.dtype}")
        _check_ids(path, tokens, vocab_size)
        starts = np.flatnonzero(tokens == eos_id)
        if len(tokens) and (not len(starts) or starts[0] != 0):  # an empty file starts nothing
            if offset:
                arrays.append(np.array([eos_id], np.promote_types(  # an id past uint16 too
                    tokens.dtype, np.min_scalar_type(eos_id))))
                offset += 1
            starts = np.concatenate([[-1 if offset else 0], starts])  # at the EOS put there
        doc_starts.append(starts + offset)
        arrays.append(tokens)
        offset += len(tokens)
    tokens = arrays[0] if len(arrays) == 1 else ConcatenatedTokens(arrays)
    return TokenStream(tokens, np.concatenate(doc_starts).astype(np.int64))


def _raw_tokens(path: Path, token_dtype: str) -> np.ndarray:
    """A raw `.bin` file as `token_dtype` ids, memory-mapped (an empty file: no ids)."""
    size, itemsize = path.stat().st_size, np.dtype(token_dtype).itemsize
    if size % itemsize:
        raise ValueError(f"token file {path} has {size} bytes, not a whole number of "
                         f"{token_dtype} ids ({itemsize} bytes each): check data.token_dtype")
    tokens = np.memmap(path, dtype=token_dtype, mode="r") if size else np.zeros(0, token_dtype)
    # Little-endian uint32 ids below 65536 read as uint16 are (id, 0) pairs: every check of
    # the ids passes, and half the tokens are 0.
    sample = np.asarray(tokens[:8192])
    if token_dtype == "uint16" and len(sample) >= 64 and not sample[1::2].any():
        raise ValueError(f"token file {path}: every second of its first {len(sample)} uint16 "
                         "ids is 0, as 32-bit ids read as 16-bit ones are: set "
                         "data.token_dtype=uint32 (or int32)")
    return tokens


def _check_ids(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Raises ValueError, naming the id, unless every id is in `[0, vocab_size)` (a negative id
    would silently index the embedding from its end)."""
    if not len(tokens):
        return
    # Unsigned ids (the usual uint16 / uint32 files) cannot be negative: one pass over the
    # file, not two.
    low = int(tokens.min()) if np.issubdtype(tokens.dtype, np.signedinteger) else 0
    high = int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"token file {path} holds id {low if low < 0 else high}, outside the "
                         f"vocabulary of {vocab_size}: expected ids in [0, {vocab_size}) "
                         "(tokenizer / model.vocab_size)")


def load_stream(files: list[Path], tokenizer: Tokenizer, *, document_regex: str = "",
                token_dtype: str = "uint16", cache_dir: Path | None = None,
                encoding: str = "utf-8") -> TokenStream:
    """The token stream of `files` (all token arrays, or all text / ArrayRecord)."""
    kinds = {file_kind(f) == "tokens" for f in files}
    if len(kinds) > 1:
        raise ValueError(f"cannot mix token arrays (.npy/.bin) with text files in one data "
                         f"path: {[str(f) for f in files]}")
    if kinds == {True}:
        return load_token_files(files, eos_id=tokenizer.eos_id, vocab_size=tokenizer.vocab_size,
                                token_dtype=token_dtype)
    return tokenize_documents(files, tokenizer, document_regex=document_regex,
                              cache_dir=cache_dir, encoding=encoding)
