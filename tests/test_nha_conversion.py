"""experiments/nha_conversion.py at its tiny size on CPU: the Hugging Face path (import →
baselines → convert → evaluate → fine-tune) in the default suite; the whole self-contained
pipeline (pretrain → export → import → ...) marked slow."""

import json
import math

import pytest

from experiments.nha_conversion import main
from hybrid_jax.data.tokenizer import train_bpe
from tests.convert.test_hf import FIXTURES
from tests.data.corpus_helpers import make_text, write_corpus


def bpe(tmp_path):
    path = tmp_path / "bpe.json"
    train_bpe([make_text(seed, 40) for seed in range(3)], 320).save(path)
    return path


def run(tmp_path, *args):
    corpus = write_corpus(tmp_path / "corpus", train_files=1, documents=40)
    out = tmp_path / "out"
    assert main(["--size", "tiny", "--out", str(out), "--train", str(corpus / "train-*.txt"),
                 "--valid", str(corpus / "valid.txt"), "--compile-cache", "none",
                 "--no-transformers-check", *args]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_pretrained_model_round_trips_through_hugging_face(tmp_path):
    """The default-suite piece: pretrain → export → import (no conversion); the imported
    export is the pretrained model (same held-out perplexity)."""
    out, results = run(tmp_path, "--tokenizer", str(bpe(tmp_path)), "--windows", "")
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(results["export"])
    [full] = results["original"]
    assert full["window"] == "full" and results["pretrain"]["steps"] == 4
    assert math.isclose(full["perplexity"], results["pretrain"]["eval_perplexity"], rel_tol=1e-5)


@pytest.mark.slow
def test_pretrains_exports_imports_converts_and_fine_tunes(tmp_path):
    out, results = run(tmp_path, "--tokenizer", str(bpe(tmp_path)))
    assert [row["window"] for row in results["original"]] == ["full", 8, 32]
    for key in ("nha-w8", "nha-w32", "original-finetuned"):  # the last: the control
        nha = results[key]
        assert nha["finetune"]["steps"] == 2 and not nha["finetune"]["time_limit_reached"]
        assert math.isfinite(nha["before_finetune"]["perplexity"])
        assert math.isfinite(nha["finetune"]["eval_perplexity"])
    assert "train.freeze=/ffn/" in results["settings"]["finetune_overrides"]
    table = (out / "results.md").read_text()
    assert "| original (full attention) | full |" in table
    assert "| NHA (converted) | 32 | 4 |" in table
    assert "| original, fine-tuned the same way | full | – |" in table


@pytest.mark.slow
def test_converts_a_hugging_face_model(tmp_path):
    _, results = run(tmp_path, "--hf-dir", str(FIXTURES / "llama"), "--windows", "8",
                     "--set", "train.steps=1")
    assert "pretrain" not in results and results["nha-w8"]["finetune"]["steps"] == 1
