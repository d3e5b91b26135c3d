"""packed_data: the token file it writes (ids past uint16, the path given) and its reader."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import experiments.benchmarks.packed_data as packed_data
from hybrid_jax.data.corpus import TokenStream


def _fake_corpus(monkeypatch, vocab_size: int, tokens: list[int]) -> None:
    """make_token_file's tokenizer and stream without a corpus or `tokenizers`."""
    stream = TokenStream(np.asarray(tokens, np.int64), np.array([0, len(tokens) // 2]))
    monkeypatch.setattr(packed_data, "resolve_files", lambda spec, kind, option: [spec])
    monkeypatch.setattr(packed_data, "corpus_texts", lambda files, regex: iter(()))
    monkeypatch.setattr(packed_data, "train_bpe", lambda texts, vocab: types.SimpleNamespace(
        vocab_size=vocab_size))
    monkeypatch.setattr(packed_data, "tokenize_documents",
                        lambda files, tokenizer, document_regex: stream)


def test_ids_past_uint16_are_kept(monkeypatch, tmp_path):
    """A vocabulary over 65536 stores its ids whole (uint16 wrapped 70000 to 4464)."""
    tokens = [1, 69999, 65536, 7, 70000, 3, 2, 5, 9]
    _fake_corpus(monkeypatch, 70001, tokens)
    out = tmp_path / "big.npz"
    packed_data.make_token_file("text", str(out), 70001, "^x")
    assert np.load(out)["tokens"].tolist() == tokens
    [batch] = packed_data.packed_batches(str(out), 2, 4, 1)
    assert batch["inputs"].max() >= 65536


def test_the_file_is_written_at_the_path_given(monkeypatch, tmp_path, capsys):
    """OUT without ".npz": numpy's savez added the suffix, so the size line after the whole
    tokenization failed (FileNotFoundError) and `--data OUT` named no file."""
    _fake_corpus(monkeypatch, 300, list(range(1, 20)))
    out = tmp_path / "tokens.bin"
    monkeypatch.setattr(sys, "argv", ["packed_data", "text", str(out), "--vocab", "300"])
    packed_data.main()
    assert out.exists() and "19 tokens, 2 documents" in capsys.readouterr().out
    assert len(packed_data.packed_batches(str(out), 2, 8, 1)[0]["inputs"]) == 2


def test_train_throughput_refuses_a_token_file_of_a_larger_vocabulary(monkeypatch, tmp_path):
    """Its models have VOCAB ids: a file of more would feed ids past the embedding table
    (silently clamped by the gather), a comparison on other data than it says."""
    from experiments.benchmarks.train_throughput import VOCAB, build_step, main

    _fake_corpus(monkeypatch, VOCAB + 10, [1, 2, VOCAB + 5] * 30)
    out = tmp_path / "big.npz"
    packed_data.make_token_file("text", str(out), VOCAB + 10, "^x")
    with pytest.raises(ValueError, match="vocabulary"):
        build_step("transformer-tiny", 8, tokens=64, data=str(out), remat="none", scan=False,
                   packed=True)
    with pytest.raises(ValueError, match="vocabulary"):  # at once, before the torch peers
        main(["--data", str(out), "--models", "transformer-tiny", "--lengths", "8",
              "--torch", "nope", "--out", str(tmp_path / "t.json")])
