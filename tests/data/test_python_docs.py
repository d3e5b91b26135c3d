"""The offline corpus of the notebooks: Python's documentation topics as train/valid text."""

import pydoc_data.topics

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


def test_the_two_splits_are_the_whole_corpus(tmp_path):
    """Not a character lost or repeated at the cut: train then valid is every topic, in name
    order, joined by blank lines."""
    python_docs_corpus(tmp_path, eval_fraction=0.5)
    topics = pydoc_data.topics.topics
    text = "\n\n".join(topics[name] for name in sorted(topics))
    train, valid = ((tmp_path / name).read_text(encoding="utf-8")
                    for name in ("train.txt", "valid.txt"))
    assert train + valid == text and len(train) == len(text) // 2


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5])
def test_refuses_an_empty_split(tmp_path, fraction):
    with pytest.raises(ValueError, match=f"eval_fraction={fraction}: expected a number in"):
        python_docs_corpus(tmp_path, eval_fraction=fraction)
