"""Text data: tokenizers, streamed files (plain, .gz, .xz, ArrayRecord, token arrays), packing
with document boundaries, the grain iterator state, and the WikiText checks (skipped without
../shared/data)."""

import dataclasses
import gzip
import lzma
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.config import ModelConfig
from hybrid_jax.data.corpus import (
    TokenStream,
    load_stream,
    resolve_files,
    text_pieces,
    tokenize_documents,
)
from hybrid_jax.data.packing import PackedWindows
from hybrid_jax.data.pipeline import train_iterator
from hybrid_jax.data.text import TextConfig
from hybrid_jax.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    WordTokenizer,
    build_word_vocab,
    load_tokenizer,
    train_bpe,
)
from hybrid_jax.nn.lm import create_model
from tests.data.corpus_helpers import ARTICLE, make_text, write_corpus

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason=f"{SHARED} (the shared corpora) is not present")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe((p.read_text() for p in sorted(corpus.glob("train-*.txt"))), 400,
                     min_frequency=1)


def test_byte_tokenizer_round_trips_and_counts_bytes():
    tok, text = ByteTokenizer(), make_text(5, 3)
    ids = tok.encode(text)
    assert tok.decode(ids) == text and ids.max() < 256 and tok.vocab_size == 257
    assert tok.token_bytes()[ids].sum() == len(text.encode()) and tok.token_bytes()[256] == 0
    assert tok.decode([104, tok.eos_id, 105]) == "hi"  # the document separator is no text
    assert tok.decode(tok.encode("a\x00é")) == "a\x00é"  # byte 0 is text
    assert tok.decode([255, 104]) == "\ufffdh"  # byte 255 too (never valid UTF-8)


def test_bpe_merges_only_pairs_seen_min_frequency_times():
    assert len(train_bpe(["xy"], 300, min_frequency=1).encode("xy")) == 1
    assert len(train_bpe(["xy"], 300).encode("xy")) == 2  # default 2: a pair seen once stays


def test_a_bpe_smaller_than_asked_is_said(caplog):
    with caplog.at_level("WARNING", logger="hybrid_jax.tokenizer"):
        assert train_bpe(["xy"], 300).vocab_size == 257  # bytes and EOS: no pair seen twice
    assert ("the BPE has 257 tokens of the 300 asked for: the text holds no more pairs seen 2 "
            "times (model.vocab_size=257 would do)") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybrid_jax.tokenizer"):
        train_bpe(["xy"], 258, min_frequency=1)
    assert not caplog.records


def test_bpe_round_trips_saves_and_loads(bpe, corpus, tmp_path):
    # Characters the merges never saw split into byte tokens that are not whole characters.
    text = (corpus / "valid.txt").read_text() + " <|endoftext|> \r\n\x00 ñ中"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text and bpe.eos_id not in ids.tolist()
    assert len(ids) < len(text.encode())  # merges were learned
    assert bpe.token_bytes()[ids].sum() == len(text.encode())  # exact bytes per token
    assert bpe.token_bytes()[bpe.eos_id] == 0  # the separator is no text
    bpe.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, HFTokenizer) and np.array_equal(loaded.encode(text), ids)


def sentencepiece_style(byte_fallback: bool) -> HFTokenizer:
    """A Llama-2-style tokenizer: "▁" spells a space and is prepended to each text; unknown
    characters fall back to `<0xNN>` byte tokens (or to `<unk>`)."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HF

    specials = ["<unk>", "<s>", "</s>"]
    pieces = [f"<0x{b:02X}>" for b in range(256)] + ["▁", "t", "h", "e", "é", "\n", "▁t", "▁th",
                                                     "▁the"]
    vocab = {t: i for i, t in enumerate(specials + pieces)}
    merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e")]
    tok = HF(models.BPE(vocab=vocab, merges=merges, byte_fallback=byte_fallback,
                        unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return HFTokenizer(tok, eos="</s>")


@pytest.mark.parametrize("byte_fallback", [False, True])
def test_sentencepiece_style_tokens_count_their_spaces_and_bytes(byte_fallback):
    """Bits-per-byte needs each token's bytes: "▁the" is 4 (a lone decode drops the space), a
    `<0xNN>` token is 1 (a lone decode is U+FFFD, 3). Only the space the tokenizer prepends to
    the text is one byte more than the text."""
    tok, text = sentencepiece_style(byte_fallback), "the thé\n日 the"
    ids = tok.encode(text)
    assert (tok.decode(ids) == text) == byte_fallback  # without byte tokens: <unk> for 日
    unk_bytes = 0 if byte_fallback else len("日".encode())
    assert tok.token_bytes()[ids].sum() == len(text.encode()) + 1 - unk_bytes
    assert tok.token_bytes()[[tok.eos_id, 0]].tolist() == [0, 0]  # special tokens: no bytes


def test_a_tokenizer_files_only_special_token_is_its_eos(tmp_path):
    """With no config beside it, a tokenizer.json's one special token is the separator."""
    from tokenizers import AddedToken, models
    from tokenizers import Tokenizer as HF

    tok = HF(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a"))
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path / "tokenizer.json").eos_id == 1


def test_word_tokenizer_one_eos_per_line():
    tok = build_word_vocab(["a b a\nc\n"])
    assert isinstance(tok, WordTokenizer) and tok.vocab[:3] == ["<eos>", "<unk>", "a"]
    ids = tok.encode("a b zz\n\nc\n")
    assert ids.tolist() == [2, tok.ids["b"], 1, 0, 0, tok.ids["c"], 0]
    assert tok.decode(ids) == "a b <unk>\n\nc\n"


def test_word_vocabulary_keeps_the_most_frequent_words():
    """`vocab_size` keeps the vocab_size − 2 most frequent words (ties by first use), the rest
    read as <unk>; too small a size is named."""
    text = "b c c a a a d b"
    assert build_word_vocab([text], 4).vocab == ["<eos>", "<unk>", "a", "b"]
    # WikiText's text holds <unk> (and may hold <eos>): the specials keep their ids, once.
    assert build_word_vocab(["<unk> x <unk> <eos>"]).vocab == ["<eos>", "<unk>", "x"]
    assert build_word_vocab([text], 100).vocab == build_word_vocab([text]).vocab
    assert build_word_vocab([text], 4).decode(build_word_vocab([text], 4).encode("a c")) == (
        "a <unk>")
    for bad in (2, 0, 3.5):
        with pytest.raises(ValueError, match=rf"vocab_size > 2 \(<eos>, <unk> and a word\), "
                                             rf"got {bad}"):
            build_word_vocab([text], bad)


def test_load_tokenizer_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        load_tokenizer(tmp_path / "bad.json")
    # Valid JSON of the wrong form raised KeyError / AttributeError, or loaded a duplicate word.
    for text, message in [('{"hybrid_jax_tokenizer": "word"}', "needs \"vocab\", a list of "
                           "words; found NoneType"),
                          ('["<eos>"]', "could not be loaded"),
                          ('{"hybrid_jax_tokenizer": "word", "vocab": ["<eos>", "<unk>", "a", '
                           '"a"]}', "lists each word once, got 'a' twice")]:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match=message):
            load_tokenizer(tmp_path / "bad.json")


def test_compressed_files_stream_to_the_same_tokens(tmp_path, monkeypatch):
    text = make_text(3, 30)
    (tmp_path / "a.txt").write_text(text)
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write(text)
    with lzma.open(tmp_path / "a.txt.xz", "wt") as f:
        f.write(text)
    monkeypatch.setattr("hybrid_jax.data.corpus.PIECE_CHARS", 40)  # several pieces per document
    pieces = list(text_pieces(tmp_path / "a.txt.xz", ARTICLE))
    assert "".join(t for _, t in pieces) == text and len(pieces) > 30
    assert sum(new for new, _ in pieces) == 30 and all(len(t) < 40 + 120 for _, t in pieces)
    streams = [tokenize_documents([tmp_path / f"a.{ext}"], ByteTokenizer(),
                                  document_regex=ARTICLE) for ext in ("txt", "txt.gz", "txt.xz")]
    for stream in streams[1:]:
        assert np.array_equal(stream.tokens, streams[0].tokens)
        assert np.array_equal(stream.doc_starts, streams[0].doc_starts)
    assert len(streams[0].doc_starts) == 30 and (streams[0].tokens == 256).sum() == 30


def test_array_record_documents(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter

    docs = [make_text(i, 1) for i in range(5)]
    writer = ArrayRecordWriter(str(tmp_path / "docs.arrayrecord"), "group_size:1")
    for doc in docs:
        writer.write(doc.encode())
    writer.close()
    stream = load_stream([tmp_path / "docs.arrayrecord"], ByteTokenizer())
    expected = np.concatenate([np.concatenate([[256], ByteTokenizer().encode(d)]) for d in docs])
    assert np.array_equal(stream.tokens, expected) and len(stream.doc_starts) == 5


@pytest.mark.parametrize("suffix", [".npy", ".bin"])
def test_token_files_are_memory_mapped(tmp_path, suffix):
    tokens = np.array([256, 1, 2, 3, 256, 4, 5, 256, 6], np.uint16)
    path = tmp_path / f"tokens{suffix}"
    np.save(path, tokens) if suffix == ".npy" else tokens.tofile(path)
    stream = load_stream([path], ByteTokenizer())
    assert isinstance(stream.tokens, np.memmap) and np.array_equal(stream.tokens, tokens)
    assert stream.doc_starts.tolist() == [0, 4, 7]
    np.array([1, 300], np.uint16).tofile(tmp_path / "big.bin")
    with pytest.raises(ValueError, match="big.bin holds id 300"):
        load_stream([tmp_path / "big.bin"], ByteTokenizer())


def test_missing_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.path: data file /no/such/file.txt"):
        resolve_files("/no/such/file.txt", "data.path")
    with pytest.raises(FileNotFoundError, match=r"data.eval_path='/no/\*.txt' matches no file"):
        resolve_files("/no/*.txt", "data.eval_path")
    with pytest.raises(ValueError, match="data.path is empty"):
        resolve_files("", "data.path")
    with pytest.raises(ValueError, match=rf"data.path='{tmp_path}' is a directory: give its "
                                         rf"files, e.g. --set data.path={tmp_path}/\*.txt"):
        resolve_files(str(tmp_path), "data.path")


def test_tokenized_cache_is_reused_and_invalidated(corpus, tmp_path):
    files = resolve_files(str(corpus / "train-*.txt"), "data.path")
    first = tokenize_documents(files, ByteTokenizer(), cache_dir=tmp_path)

    class Unused(ByteTokenizer):
        def encode_batch(self, texts):
            raise AssertionError("a cached stream is read, not tokenized again")

    again = tokenize_documents(files, Unused(), cache_dir=tmp_path)
    assert isinstance(again.tokens, np.memmap) and np.array_equal(again.tokens, first.tokens)
    assert again.num_words == first.num_words > 0
    copy = tmp_path / "copy.txt"
    copy.write_text("x\n")
    changed = tokenize_documents([copy], ByteTokenizer(), cache_dir=tmp_path)
    copy.write_text("xy\n")
    assert len(tokenize_documents([copy], ByteTokenizer(), cache_dir=tmp_path)) == \
        len(changed) + 1


def test_a_runs_token_cache_lives_in_its_directory(corpus, tmp_path):
    """Bound to a run directory without `cache_dir`, the token streams are cached under
    RUN_DIR/data_cache (memory-mapped by the next bind); without a run directory, nowhere."""
    config = TextConfig(path=str(corpus / "train-0.txt"), seq_len=16)
    first = config.bind(tmp_path).stream("train")
    assert any((tmp_path / "data_cache").iterdir())
    again = config.bind(tmp_path).stream("train")
    assert isinstance(again.tokens, np.memmap) and np.array_equal(again.tokens, first.tokens)
    assert config.bind(None).cache_dir is None


def test_tokenized_cache_is_keyed_by_content_regex_tokenizer_and_encoding(tmp_path):
    """Each input of the token stream changes the key: a file rewritten at the same size (its
    modification time), the document regex, the tokenizer and the encoding."""
    text = tmp_path / "a.txt"
    text.write_text("= A =\nab\n= B =\ncd\n")
    cache = tmp_path / "cache"

    def stream(tokenizer=None, **kw):
        return tokenize_documents([text], tokenizer or ByteTokenizer(), cache_dir=cache, **kw)

    first = np.asarray(stream().tokens)
    text.write_text("= A =\nab\n= B =\ncz\n")  # the same size
    os.utime(text, ns=(text.stat().st_atime_ns, text.stat().st_mtime_ns + 10**9))
    assert not np.array_equal(np.asarray(stream().tokens), first)
    assert len(stream(document_regex=r"^= [AB] =").doc_starts) == 2 != len(stream().doc_starts)
    words = build_word_vocab(["= A = ab = B = cz"])
    assert len(stream(words).tokens) < len(stream().tokens)
    text.write_bytes(b"= A =\nab\n= B =\nc\x80\n")  # U+0080 in latin-1, the euro in cp1252
    assert len(stream(encoding="cp1252").tokens) == len(stream(encoding="latin-1").tokens) + 1


def test_windows_keep_documents_apart():
    # Documents of lengths 3, 5, 2 (each led by the eos token 9): boundaries at 0, 3, 8.
    tokens = np.array([9, 1, 2, 9, 3, 4, 5, 6, 9, 7], np.int32)
    stream = TokenStream(tokens, np.array([0, 3, 8]))
    train = PackedWindows(stream, 4)
    assert len(train) == 2  # 9 targets: two whole windows of 4
    row = train[1]  # positions 4..7 of the stream, targets 5..8
    assert row["inputs"].tolist() == [3, 4, 5, 6] and row["targets"].tolist() == [4, 5, 6, 9]
    assert row["segment_ids"].tolist() == [1, 1, 1, 1]
    assert row["positions"].tolist() == [0, 1, 2, 3]  # restarts at the window start
    row = train[0]
    assert row["segment_ids"].tolist() == [1, 1, 1, 2] and row["positions"].tolist() == [0, 1,
                                                                                          2, 0]
    evals = PackedWindows(stream, 4, pad_last=True, token_bytes=np.ones(10, np.int32))
    assert len(evals) == 3
    last = evals[2]
    assert last["mask"].tolist() == [True, False, False, False]
    assert last["segment_ids"].tolist() == [1, 0, 0, 0] and last["targets"][0] == 7
    covered = np.concatenate([evals[i]["targets"][evals[i]["mask"]] for i in range(3)])
    assert np.array_equal(covered, tokens[1:])  # every token after the first, scored once


@pytest.mark.parametrize("length, seq_len, whole, padded", [
    (9, 4, 2, 2),  # 8 targets: two whole windows, nothing left over
    (10, 4, 2, 3),  # 9 targets: one left over for the padded window
    (8, 4, 1, 2),  # 7 targets: the second window is short by one
    (5, 4, 1, 1), (4, 4, None, 1),  # one target short of a window: only padded
    (3, 1, 2, 2),  # seq_len 1: a window a target
    (1, 1, None, None),  # one token: nothing to predict
])
def test_window_counts_at_the_boundaries(length, seq_len, whole, padded):
    """len() is ⌊(N−1)/L⌋ (⌈(N−1)/L⌉ padded) for N tokens; every window index reads, the one
    past the end raises; a stream too short for one window is refused by name."""
    stream = TokenStream(np.arange(length, dtype=np.int32), np.array([0]))
    for pad_last, count in ((False, whole), (True, padded)):
        if count is None:
            with pytest.raises(ValueError, match=f"the data has {length} tokens"):
                PackedWindows(stream, seq_len, pad_last=pad_last)
            continue
        windows = PackedWindows(stream, seq_len, pad_last=pad_last)
        assert len(windows) == count
        rows = [windows[i] for i in range(count)]
        assert all(len(r["inputs"]) == seq_len for r in rows)
        scored = np.concatenate([r["targets"][r["mask"]] for r in rows])
        assert scored.tolist() == list(range(1, 1 + len(scored)))
        assert len(scored) == (length - 1 if pad_last else count * seq_len)
        with pytest.raises(IndexError, match=f"window {count} out of range"):
            windows[count]


def test_windows_refuse_bad_streams_lengths_and_indices():
    """A stream whose first document starts anywhere but offset 0 (1 too), none, seq_len 0;
    a negative window index is out of range like one past the end, not counted from it."""
    tokens = np.arange(10, dtype=np.int32)
    for starts in ([2, 5], [1, 5]):
        with pytest.raises(ValueError, match=f"start a document at offset 0, got its first at "
                                             f"offset {starts[0]}$"):
            PackedWindows(TokenStream(tokens, np.array(starts)), 4)
    with pytest.raises(ValueError, match="start a document at offset 0, got no document starts"):
        PackedWindows(TokenStream(tokens, np.array([], np.int64)), 4)
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        PackedWindows(TokenStream(tokens, np.array([0])), 0)
    windows = PackedWindows(TokenStream(tokens, np.array([0])), 4)
    with pytest.raises(IndexError, match=r"window -1 out of range for 2 windows"):
        windows[-1]


def test_too_short_data_names_its_setting(tmp_path):
    """Too few tokens for one window: the message says which files (train or held-out) and
    the counts; it said "the data" for both."""
    (tmp_path / "train.txt").write_text("abcdefghij")  # 10 byte tokens + <eos>
    (tmp_path / "valid.txt").write_text("")
    data = TextConfig(path=str(tmp_path / "train.txt"), eval_path=str(tmp_path / "valid.txt"),
                      tokenizer="byte", seq_len=16).bind(None)
    with pytest.raises(ValueError, match=rf"^data.path='{tmp_path}/train.txt' has 11 tokens, "
                                         r"too few for one sequence of seq_len=16 \(\+1 "):
        data.source("train")
    with pytest.raises(ValueError, match=rf"^data.eval_path='{tmp_path}/valid.txt' has 0 "
                                         "tokens"):
        data.source("eval")
    assert len(dataclasses.replace(data.config, seq_len=10).bind(None).source("train")) == 1


def test_held_out_files_that_are_training_files_are_named(corpus, caplog):
    """An eval loss on training text silently looked like a held-out one; evaluating without
    the training files at hand still works."""
    config = TextConfig(path=str(corpus / "train-*.txt"), seq_len=16,
                        eval_path=f"{corpus}/valid.txt,{corpus}/../{corpus.name}/train-1.txt")
    config.bind(None).stream("eval")
    assert "share 1 file(s), e.g. " in caplog.text and "train-1.txt" in caplog.text
    caplog.clear()
    for path in (str(corpus / "train-*.txt"), str(corpus / "gone.txt")):
        dataclasses.replace(config, path=path, eval_path=str(corpus / "valid.txt")
                            ).bind(None).stream("eval")
    assert "share" not in caplog.text


def test_eval_batches_count_every_byte(corpus):
    data = TextConfig(path=str(corpus / "train-0.txt"), eval_path=str(corpus / "valid.txt"),
                      seq_len=16, document_regex=ARTICLE, word_perplexity=True).bind(None)
    batches = data.eval_batches(batch_size=4)
    text = (corpus / "valid.txt").read_text()
    scored_bytes = sum(int((b["target_bytes"] * b["mask"]).sum()) for b in batches)
    assert scored_bytes == len(text.encode())
    assert data.eval_words(batches) == sum(len(line.split()) + 1
                                           for line in text.splitlines())
    assert data.eval_words(batches[:1]) is None  # only a part was evaluated
    one_short = [dict(b) for b in batches]
    one_short[0]["mask"] = one_short[0]["mask"].copy()
    one_short[0]["mask"][0, 0] = 0
    assert data.eval_words(one_short) is None  # every scored target but one
    assert dataclasses.replace(data.config, word_perplexity=False).bind(None).eval_words(
        batches) is None  # not asked for
    # Every batch holds batch_size rows: the windows in order, then unscored zero rows.
    windows = data.source("eval")
    assert all(len(b["inputs"]) == 4 for b in batches)
    assert len(batches) == -(-len(windows) // 4) > 1 and len(windows) % 4
    last, start = batches[-1], (len(batches) - 1) * 4
    real = len(windows) - start
    np.testing.assert_array_equal(last["inputs"][:real],
                                  np.stack([windows[i]["inputs"] for i in range(start,
                                                                                len(windows))]))
    assert not last["inputs"][real:].any() and not last["mask"][real:].any()
    assert len(data.eval_batches(batch_size=4, num_batches=1)) == 1
    assert len(data.eval_batches(batch_size=4, num_batches=10**6)) == len(batches)  # all there are


def test_packed_documents_do_not_leak():
    """Logits of a document packed after another equal the logits of that document alone."""
    model = create_model(ModelConfig(layers=("attention",), vocab_size=257, d_model=16,
                                     num_heads=2, ffn_dim=32))
    stream = TokenStream(np.array([256, 5, 6, 7, 256, 8, 9, 10, 11], np.int32),
                         np.array([0, 4]))
    row = PackedWindows(stream, 8)[0]
    alone = np.array([[256, 8, 9, 10]], np.int32)

    @jax.jit
    def both(row, alone):
        packed = model(row["inputs"][None], positions_BT=row["positions"][None],
                       segment_ids_BT=row["segment_ids"][None])
        return packed[0, 4:], model(alone)[0]

    packed, single = both({k: jnp.asarray(v) for k, v in row.items()}, alone)
    np.testing.assert_allclose(packed, single, rtol=1e-5, atol=1e-5)


def test_iterator_state_restores_the_same_batches(corpus):
    data = TextConfig(path=str(corpus / "train-*.txt"), seq_len=16).bind(None)
    it = train_iterator(data, batch_size=4, seed=3)
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(2)]
    again = train_iterator(data, batch_size=4, seed=3)
    again.set_state(state)
    for want in expected:
        got = next(again)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    other_seed = next(train_iterator(data, batch_size=4, seed=4))
    assert not np.array_equal(other_seed["inputs"], expected[0]["inputs"])


def test_tokenizer_spec_reuses_a_recorded_tokenizer_only_when_it_fits(corpus, bpe, tmp_path):
    """A run directory's tokenizer.json (e.g. from `hybrid-jax tokenizer train --out`) is used by
    a "bpe:N" of its vocabulary and by a resume whatever the spec; another vocabulary, "word"
    and "byte" replace it. Each bound tokenizer is recorded."""
    recorded = tmp_path / "tokenizer.json"
    bpe.save(recorded)  # trained on every train file: a retrain on train-0 alone differs
    text = (corpus / "valid.txt").read_text()

    def bound(spec: str, resume: bool = False):
        config = TextConfig(path=str(corpus / "train-0.txt"), tokenizer=spec)
        return config.bind(tmp_path, resume=resume).tokenizer

    retrained = train_bpe([(corpus / "train-0.txt").read_text()], bpe.vocab_size)
    assert not np.array_equal(retrained.encode(text), bpe.encode(text))
    np.testing.assert_array_equal(bound(f"bpe:{bpe.vocab_size}").encode(text), bpe.encode(text))
    smaller = bound("bpe:300")
    assert smaller.vocab_size <= 300 and load_tokenizer(recorded).vocab_size == smaller.vocab_size
    assert isinstance(bound("word"), WordTokenizer)
    small = build_word_vocab(["zebra quagga"])  # recorded: "word" reuses it, not the corpus's
    small.save(recorded)
    assert bound("word").to_json() == small.to_json()
    assert isinstance(bound("byte", resume=True), WordTokenizer)  # a resume keeps the record
    assert isinstance(bound("byte"), ByteTokenizer)
    assert isinstance(load_tokenizer(recorded), ByteTokenizer)


def test_text_config_validates_options():
    with pytest.raises(ValueError, match="TextConfig.tokenizer='bpe:x'"):
        TextConfig(tokenizer="bpe:x")
    with pytest.raises(ValueError, match=r"'bpe:257': a byte-level BPE needs a vocabulary of "
                                         "at least 258"):
        TextConfig(tokenizer="bpe:257")
    with pytest.raises(ValueError, match="TextConfig.document_regex"):
        TextConfig(document_regex="(")
    with pytest.raises(ValueError, match="TextConfig.seq_len=0"):
        TextConfig(seq_len=0)
    with pytest.raises(ValueError, match=r"needs vocab_size >= 258 .*, got 257"):
        train_bpe(["abc"], 257)
    with pytest.raises(ValueError, match="unknown split 'test'; expected 'train' or 'eval'"):
        TextConfig(path="a.txt").bind(None).stream("test")


@needs_shared
def test_wikitext2_word_level_token_counts():
    """One <eos> per line: the canonical 2,088,628 / 217,646 / 245,569."""
    folder = SHARED / "wikitext-2"
    tokenizer = build_word_vocab(p.read_text() for p in [folder / "wiki.train.tokens"])
    counts = []
    for split in ("train", "valid", "test"):
        stream = tokenize_documents([folder / f"wiki.{split}.tokens"], tokenizer)
        assert stream.num_words == len(stream) - 1  # one document: one leading separator
        counts.append(len(stream) - 1)
    assert counts == [2_088_628, 217_646, 245_569]


@needs_shared
def test_bpe_trained_on_wikitext2_train_round_trips_test():
    folder = SHARED / "wikitext-2-raw"
    tokenizer = train_bpe((text for _, text in text_pieces(folder / "wiki.train.raw")), 2048)
    text = (folder / "wiki.test.raw").read_text(encoding="utf-8")
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(ids) < 0.4 * len(text.encode())


def test_word_tokenizer_counts_utf8_bytes_and_refuses_bad_ids_and_vocabularies():
    tok = WordTokenizer(["<eos>", "<unk>", "é", "a"])
    assert tok.encode("é a\nzz\n").tolist() == [2, 3, 0, 1, 0]
    assert tok.token_bytes().tolist() == [1, 6, 3, 2]  # a word and its separator, in bytes
    assert tok.decode([3]) == "a"
    for bad in (4, -1):  # -1 read the last word
        with pytest.raises(ValueError, match=rf"cannot decode token id {bad} .* ids in \[0, 4\)"):
            tok.decode([3, bad])
    with pytest.raises(ValueError, match="a word vocabulary starts with"):
        WordTokenizer(["<eos>", "a"])


def test_a_recorded_tokenizer_keeps_its_eos(tmp_path):
    """A Hugging Face tokenizer whose EOS a tokenizer_config.json beside it names is recorded in
    the run directory with that EOS: a resume, generation and export read the same separator
    (the copy used to lose it, and the resume took another special token, with a warning)."""
    import json

    bpe = train_bpe(["ab ab\n"] * 4, 259, min_frequency=1)
    bpe.tokenizer.add_special_tokens(["<|im_end|>"])
    source = tmp_path / "source"
    bpe.save(source / "tokenizer.json")
    (source / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    run = tmp_path / "run"
    config = TextConfig(path=str(source / "tokenizer.json"),
                        tokenizer=str(source / "tokenizer.json"))
    eos = config.bind(run).tokenizer.eos_id
    assert eos == bpe.tokenizer.token_to_id("<|im_end|>")
    assert load_tokenizer(run / "tokenizer.json").eos_id == eos
    assert config.bind(run, resume=True).tokenizer.eos_id == eos
    # Our own BPE (its only special token is its EOS) needs no file beside it, and one left
    # there naming another token is updated, its other settings kept.
    (run / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>",
                                                           "model_max_length": 8}))
    train_bpe(["ab ab\n"] * 4, 259, min_frequency=1).save(run / "tokenizer.json")
    assert load_tokenizer(run / "tokenizer.json").eos_id == 0
    assert json.loads((run / "tokenizer_config.json").read_text())["model_max_length"] == 8
    bpe.save(tmp_path / "own" / "tokenizer.json")
    assert load_tokenizer(tmp_path / "own" / "tokenizer.json").eos_id == 0
    assert sorted(p.name for p in (tmp_path / "own").iterdir()) == ["tokenizer.json"]


def test_only_the_main_process_records_the_tokenizer(corpus, tmp_path, monkeypatch):
    """Every process of a multi-host run binds the data; two writing RUN_DIR/tokenizer.json at
    once shared one temporary file (one of them failed, or a reader saw it half written)."""
    import hybrid_jax.data.text as text

    monkeypatch.setattr(text, "is_main_process", lambda: False)
    config = TextConfig(path=str(corpus / "train-0.txt"), tokenizer="byte")
    assert isinstance(config.bind(tmp_path).tokenizer, ByteTokenizer)
    assert not (tmp_path / "tokenizer.json").exists()
