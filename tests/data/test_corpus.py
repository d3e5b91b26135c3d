"""Corpus files to token streams, at their edges: file kinds and lists, where text is cut into
pieces, the token dtype at the uint16 limit, empty files, and pre-tokenized arrays (document
starts across files, refused shapes, dtypes and ids)."""

import bz2
import os

import numpy as np
import pytest

from hybrid_jax.data import corpus
from hybrid_jax.data.corpus import (
    TokenStream,
    file_kind,
    load_stream,
    resolve_files,
    text_pieces,
    tokenize_documents,
)
from hybrid_jax.data.packing import PackedWindows
from hybrid_jax.data.tokenizer import WORD_EOS, WORD_UNK, ByteTokenizer, WordTokenizer


@pytest.mark.parametrize("name, kind", [
    ("a.npy", "tokens"), ("a.NPY", "tokens"), ("a.bin", "tokens"),
    ("a.arrayrecord", "arrayrecord"), ("a.array_record", "arrayrecord"),
    ("a.txt", "text"), ("a.raw.gz", "text"), ("wiki.train.tokens", "text"),
])
def test_file_kind_by_extension(name, kind, tmp_path):
    assert file_kind(tmp_path / name) == kind


def test_paths_and_globs_comma_separated_in_order(tmp_path):
    for name in ("a.txt", "b.txt", "c.txt", "z.txt"):
        (tmp_path / name).write_text("x\n")
    spec = f"{tmp_path}/z.txt, {tmp_path}/[ab].txt,,{tmp_path}/c.txt "
    assert resolve_files(spec, "data.path") == [tmp_path / n for n in ("z.txt", "a.txt",
                                                                         "b.txt", "c.txt")]


def test_pieces_end_at_the_line_that_reaches_the_size(tmp_path, monkeypatch):
    """A piece ends after the line that brings it to PIECE_CHARS, and at each document start;
    only a piece that starts a document says so."""
    monkeypatch.setattr(corpus, "PIECE_CHARS", 10)
    path = tmp_path / "docs.txt"
    path.write_text("= a\n" + "bbbb\n" * 5 + "= c\n" + "dddd\n" * 2)
    assert list(text_pieces(path, "^= ")) == [
        (True, "= a\nbbbb\nbbbb\n"),   # 4, 9, 14 characters
        (False, "bbbb\nbbbb\n"),       # 5, 10
        (False, "bbbb\n"),             # cut by the next document
        (True, "= c\ndddd\ndddd\n"),
    ]


def test_bz2_is_read_other_compressions_are_named(tmp_path):
    """A .bz2 or .zst file was "not valid utf-8 text: set data.encoding", advice that would
    train on the compressed bytes."""
    (tmp_path / "a.txt.bz2").write_bytes(bz2.compress("héllo\nworld\n".encode()))
    assert list(text_pieces(tmp_path / "a.txt.bz2")) == [(True, "héllo\nworld\n")]
    (tmp_path / "a.txt.zst").write_bytes(bytes.fromhex("28b52ffd0058"))
    with pytest.raises(ValueError, match=r"a.txt.zst: .zst compression cannot be read; "
                                         r"decompress it or compress it as .gz, .xz, .bz2"):
        list(text_pieces(tmp_path / "a.txt.zst"))
    (tmp_path / "bad.bz2").write_bytes(b"BZh9 not a stream")
    with pytest.raises(ValueError, match=r"bad.bz2 is a damaged .bz2 stream \(after line 0\)"):
        list(text_pieces(tmp_path / "bad.bz2"))


def test_a_nul_byte_is_named_with_its_line(tmp_path):
    path = tmp_path / "data.txt"
    path.write_bytes(b"text\nbinary\x00here\n")
    with pytest.raises(ValueError, match=r"data.txt looks binary \(a NUL byte on line 2\)"):
        list(text_pieces(path))


def test_the_document_regex_matches_at_line_starts(tmp_path):
    """`document_regex` is matched at the start of a line (as `re.match`), without its line
    end (\\r\\n included): "Produced by" inside a line starts no document."""
    path = tmp_path / "books.txt"
    path.write_bytes(b"Produced by A\ntext. Produced by A\nProduced by C\r\nend\n")
    assert list(text_pieces(path, "Produced by [AC]$")) == [
        (True, "Produced by A\ntext. Produced by A\n"), (True, "Produced by C\r\nend\n")]


def test_a_utf8_byte_order_mark_is_no_text(tmp_path):
    """A Windows editor's BOM was tokenized as text (3 bytes at every file's start) and hid
    the first line from `document_regex`."""
    path = tmp_path / "notes.txt"
    path.write_bytes("\ufeffProduced by A\nx\nProduced by C\n".encode())
    assert [text for _, text in text_pieces(path, "Produced by [AC]$")] == [
        "Produced by A\nx\n", "Produced by C\n"]
    assert tokenize_documents([path], ByteTokenizer()).tokens[:3].tolist() == [256, 80, 114]


@pytest.mark.parametrize("vocab_size, dtype", [(65536, np.uint16), (65537, np.uint32)])
def test_token_dtype_holds_every_id(vocab_size, dtype, tmp_path):
    words = [WORD_EOS, WORD_UNK] + [f"w{i}" for i in range(2, vocab_size)]
    path = tmp_path / "top.txt"
    path.write_text(f"w2 w{vocab_size - 1}\n")
    stream = tokenize_documents([path], WordTokenizer(words))
    assert stream.tokens.dtype == dtype
    assert stream.tokens.tolist() == [0, 2, vocab_size - 1, 0]


def test_an_empty_file_is_an_empty_stream(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("")
    cache = tmp_path / "cache" / "nested"  # created with its parents
    for cache_dir in (None, cache, cache):  # in memory, written to the cache, read from it
        stream = tokenize_documents([path], ByteTokenizer(), cache_dir=cache_dir)
        assert len(stream) == 0 and stream.tokens.dtype == np.uint16
        assert stream.doc_starts.tolist() == [] and stream.num_words == 0


def test_token_files_start_documents_at_eos_across_files(tmp_path):
    """A file that does not start with the end-of-document id starts a document anyway, after
    another file behind an end-of-document id put there (7 was trained to predict 8, the next
    file's first token, across the boundary); the starts of later files are offset by the
    tokens before them. Words are unknown (-1)."""
    np.save(tmp_path / "a.npy", np.array([5, 256, 6, 7], np.uint16))
    np.save(tmp_path / "b.npy", np.array([8, 9], np.uint16))  # no end-of-document id
    np.save(tmp_path / "c.npy", np.array([256, 1, 256], np.uint16))
    stream = load_stream([tmp_path / f"{n}.npy" for n in "abc"], ByteTokenizer())
    assert np.asarray(stream.tokens).tolist() == [5, 256, 6, 7, 256, 8, 9, 256, 1, 256]
    assert stream.doc_starts.tolist() == [0, 1, 4, 7, 9] and stream.num_words == -1


@pytest.mark.parametrize("array, message", [
    (np.zeros((2, 3), np.uint16), r"expected a 1-D integer array, found shape \(2, 3\)"),
    (np.zeros(4, np.float32), "expected a 1-D integer array, found shape .4,. dtype float32"),
    (np.array([1, 257], np.uint16), "holds id 257, outside the vocabulary of 257"),
    (np.array([256, 5, -3], np.int32), r"holds id -3, .* expected ids in \[0, 257\)"),
])
def test_token_files_refuse_shapes_dtypes_and_ids(array, message, tmp_path):
    np.save(tmp_path / "bad.npy", array)
    with pytest.raises(ValueError, match=message):
        load_stream([tmp_path / "bad.npy"], ByteTokenizer())


def test_token_shards_stay_on_disk_and_pack_across_their_boundaries(tmp_path):
    """Several token files were concatenated into one array in memory (a corpus of shards
    larger than memory could not load); now each stays memory-mapped, and the windows that
    cross a boundary (also an empty shard's) are those of the concatenation, with the
    end-of-document ids put before shards that do not start with one."""
    shards = [np.array([256, 1, 2, 3, 4], np.uint16), np.zeros(0, np.uint16),
              np.array([5, 256, 6], np.uint16), np.array([7, 8, 256, 9, 10, 11], np.int32)]
    for i, shard in enumerate(shards):
        np.save(tmp_path / f"{i}.npy", shard)
    stream = load_stream([tmp_path / f"{i}.npy" for i in range(4)], ByteTokenizer())
    assert [isinstance(a, np.memmap) for a in stream.tokens.arrays] == [
        True, True, False, True, False, True]  # the put ids: one each
    whole = np.concatenate([shards[0], shards[1], [256], shards[2], [256], shards[3]])
    assert np.asarray(stream.tokens).tolist() == whole.tolist() and len(stream) == 16
    for start, stop in [(0, 16), (3, 9), (4, 5), (5, 5), (8, 20), (15, 16)]:
        assert stream.tokens[start:stop].tolist() == whole[start:stop].tolist()
    flat = TokenStream(whole, stream.doc_starts)
    for seq_len in (1, 3, 4):
        packed, expected = PackedWindows(stream, seq_len), PackedWindows(flat, seq_len)
        for i in range(len(expected)):
            for key, value in expected[i].items():
                assert packed[i][key].tolist() == value.tolist(), (seq_len, i, key)


def test_raw_token_files_empty_or_cut_mid_id(tmp_path):
    """An empty .bin file holds no tokens and starts no document (like an empty .npy); a size
    that is not whole ids of data.token_dtype names the file and the setting."""
    (tmp_path / "empty.bin").write_bytes(b"")
    np.array([256, 4, 256], np.uint16).tofile(tmp_path / "a.bin")
    np.save(tmp_path / "empty.npy", np.zeros(0, np.uint16))
    files = [tmp_path / n for n in ("empty.bin", "a.bin", "empty.npy")]
    stream = load_stream(files, ByteTokenizer())
    assert np.asarray(stream.tokens).tolist() == [256, 4, 256]
    assert stream.doc_starts.tolist() == [0, 2]
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match=r"odd.bin has 3 bytes, not a whole number of uint16 "
                       r"ids .* data.token_dtype"):
        load_stream([tmp_path / "odd.bin"], ByteTokenizer())


def test_the_encoding_hint_names_utf_16_for_a_file_with_its_byte_order_mark(tmp_path):
    """A UTF-16 file read as UTF-8 was told to try latin-1 or cp1252."""
    (tmp_path / "wide.txt").write_text("caf\u00e9\n", encoding="utf-16")
    (tmp_path / "latin.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    for name, hint in (("wide.txt", r"\(e.g. utf-16\)"), ("latin.txt", r"\(e.g. latin-1, ")):
        with pytest.raises(ValueError, match=rf"{name} is not valid utf-8 text .*{hint}"):
            tokenize_documents([tmp_path / name], ByteTokenizer())


def test_32_bit_ids_read_as_16_bit_ones_are_refused(tmp_path):
    """uint32 ids read with the default data.token_dtype=uint16 came out as (id, 0) pairs that
    pass every id check; the same file read as uint32 loads."""
    ids = np.random.default_rng(0).integers(1, 257, 100).astype(np.uint32)
    ids.tofile(tmp_path / "wide.bin")
    with pytest.raises(ValueError, match=r"wide.bin: every second of its first 200 uint16 ids "
                                         r"is 0, .* set data.token_dtype=uint32"):
        load_stream([tmp_path / "wide.bin"], ByteTokenizer())
    assert np.asarray(load_stream([tmp_path / "wide.bin"], ByteTokenizer(),
                                  token_dtype="uint32").tokens).tolist()[:3] == ids[:3].tolist()


def test_token_arrays_and_text_do_not_mix(tmp_path):
    np.save(tmp_path / "a.npy", np.array([256, 1], np.uint16))
    (tmp_path / "b.txt").write_text("x\n")
    with pytest.raises(ValueError, match="cannot mix token arrays"):
        load_stream([tmp_path / "a.npy", tmp_path / "b.txt"], ByteTokenizer())


def test_writers_of_one_cache_entry_at_once_each_get_the_whole_stream(tmp_path):
    """The hosts of a run (or parallel runs) sharing a cache may tokenize the same files at once:
    here a second writer runs to completion while the first is half way. Each has temporary files
    of its own, so neither loses its file nor reads the other's half-written bytes."""
    path, cache = tmp_path / "a.txt", tmp_path / "cache"
    path.write_text("héllo\nworld\n")
    others = []

    class Interleaved(ByteTokenizer):
        def encode_batch(self, texts):
            if not others:  # the first writer's file is open: the other writer runs now
                others.append(tokenize_documents([path], ByteTokenizer(), cache_dir=cache))
            return super().encode_batch(texts)

    first = tokenize_documents([path], Interleaved(), cache_dir=cache)
    expected = [256, *"héllo\nworld\n".encode()]
    assert first.tokens.tolist() == others[0].tokens.tolist() == expected
    assert tokenize_documents([path], ByteTokenizer(), cache_dir=cache).tokens.tolist() == expected
    assert sorted(p.suffix for p in cache.iterdir()) == [".bin", ".json", ".npy"]  # no leftovers


def test_a_failed_tokenization_leaves_no_temporary_files(tmp_path):
    """An error (or Ctrl-C) half way through a corpus removes the partial token file it was
    writing to the cache (it used to stay behind as `.tmp`, as large as what was read), and a
    cache file whose writing fails leaves no temporary file either."""
    path, cache = tmp_path / "a.txt", tmp_path / "cache"
    path.write_text("".join(f"line {i}\n" for i in range(40)))

    class Interrupted(ByteTokenizer):
        calls = 0

        def encode_batch(self, texts):
            self.calls += 1
            if self.calls == 3:  # two batches are already in the cache's partial file
                raise KeyboardInterrupt
            return super().encode_batch(texts)

    with pytest.raises(KeyboardInterrupt):
        tokenize_documents([path], Interrupted(), document_regex="line", cache_dir=cache)
    assert list(cache.iterdir()) == []
    with pytest.raises(OSError, match="disk full"):
        corpus._write_replacing(cache / "x.json", lambda f: (f.write(b"{"), _raise(OSError(
            "disk full"))))
    assert list(cache.iterdir()) == []
    stream = tokenize_documents([path], ByteTokenizer(), document_regex="line", cache_dir=cache)
    assert len(stream.doc_starts) == 40  # a later try works
    assert sorted(p.suffix for p in cache.iterdir()) == [".bin", ".json", ".npy"]


def test_cache_files_get_a_plain_writes_mode(tmp_path):
    """The cache's files take the umask's mode, as a plain write gives them (tempfile's 0600
    left a shared cache unreadable by its other users)."""
    path = tmp_path / "doc.txt"
    path.write_text("one\ntwo\n")
    old = os.umask(0o022)
    try:
        tokenize_documents([path], ByteTokenizer(), cache_dir=tmp_path / "cache")
    finally:
        os.umask(old)
    modes = {p.suffix: p.stat().st_mode & 0o777 for p in (tmp_path / "cache").iterdir()}
    assert modes == {".bin": 0o644, ".json": 0o644, ".npy": 0o644}, modes


def _raise(error: BaseException):
    raise error


def _two_specials_bpe():
    """A tiny byte-level BPE with two special tokens, either of which may be its EOS."""
    from hybrid_jax.data.tokenizer import train_bpe

    bpe = train_bpe(["ab ab\n"] * 4, 259, min_frequency=1)
    bpe.tokenizer.add_special_tokens(["<|im_end|>"])
    return bpe


def test_the_token_cache_is_keyed_by_the_tokenizers_eos(tmp_path):
    """One tokenizer.json read with another end-of-document token (a tokenizer_config.json
    beside it names it) makes another stream: the cache of the first used to be returned, its
    documents led by the other EOS id."""
    from tokenizers import Tokenizer as HF

    from hybrid_jax.data.tokenizer import EOS, HFTokenizer

    path, cache = tmp_path / "a.txt", tmp_path / "cache"
    path.write_text("ab\n")
    spec = _two_specials_bpe().to_json()
    for eos in (EOS, "<|im_end|>", EOS):
        tokenizer = HFTokenizer(HF.from_str(spec), eos=eos)
        stream = tokenize_documents([path], tokenizer, cache_dir=cache)
        assert int(stream.tokens[0]) == tokenizer.eos_id, eos


def test_a_tokenizer_with_gaps_in_its_ids_counts_up_to_its_largest(tmp_path):
    """A tokenizer.json may number its tokens with gaps (ids reserved, added tokens placed
    high): its size is its largest id + 1, not its count of tokens, else the cache's uint16
    ids wrapped (70000 became 4464) and the model's vocabulary check passed a too-small
    embedding."""
    from tokenizers import AddedToken, models, pre_tokenizers
    from tokenizers import Tokenizer as HF

    from hybrid_jax.data.tokenizer import HFTokenizer

    tok = HF(models.WordLevel({"a": 0, "</s>": 1, "b": 70000}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    tokenizer = HFTokenizer(tok, eos="</s>")
    assert tokenizer.vocab_size == 70001
    path = tmp_path / "a.txt"
    path.write_text("a b\n")
    assert tokenize_documents([path], tokenizer).tokens.tolist() == [1, 0, 70000]
    assert tokenizer.token_bytes()[70000] > 0  # its bytes have a place (an IndexError before)
