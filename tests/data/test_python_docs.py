"""The offline corpus of the notebooks: Python's documentation topics as train/valid text."""

import pytest

from hybrid_jax.data.python_docs import python_docs_corpus


def test_writes_a_held_out_split_and_its_config(tmp_path):
    config = python_docs_corpus(tmp_path / "corpus", seq_len=64, eval_fraction=0.25)
    train = (tmp_path / "corpus" / "train.txt").read_text(encoding="utf-8")
    valid = (tmp_path / "corpus" / "valid.txt").read_text(encoding="utf-8")
    assert (config.path, config.eval_path, config.seq_len) == (
        str(tmp_path / "corpus" / "train.txt"), str(tmp_path / "corpus" / "valid.txt"), 64)
    assert len(train) > 100_000 and abs(len(valid) / (len(train) + len(valid)) - 0.25) < 1e-3
    assert "assert" in train and valid not in train  # English text; the split is disjoint


def test_refuses_an_empty_split(tmp_path):
    with pytest.raises(ValueError, match="eval_fraction=1.0: expected a number in"):
        python_docs_corpus(tmp_path, eval_fraction=1.0)
