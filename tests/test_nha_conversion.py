"""experiments/nha_conversion.py at its tiny size on CPU: the Hugging Face path (import →
baselines → convert → evaluate → fine-tune) in the default suite; the whole self-contained
pipeline (pretrain → export → import → ...) marked slow."""

import json
import math

import pytest

from experiments.nha_conversion import CONTROL, Report, _read_last, main, training_summary
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
    out, results = run(tmp_path, "--tokenizer", str(bpe(tmp_path)), "--windows", "",
                       "--slots", "3")
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(results["export"])
    [full] = results["original"]
    assert full["window"] == "full" and results["pretrain"]["steps"] == 4
    assert results["settings"]["slots"] == 3 and results["settings"]["windows"] == []
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


def test_table_cells(tmp_path):
    """Each number of results.md from its place in results.json: the two original rows'
    labels, before / after of each fine-tune (a skipped one: dashes), tokens and the time cap."""
    report = Report(tmp_path, {"windows": [8, 32], "slots": 4, "finetune_tokens_per_step": 100})
    report.data.update({
        "original": [{"window": "full", "perplexity": 10.0},
                     {"window": 8, "perplexity": 40.0}, {"window": 32, "perplexity": 20.0}],
        "nha-w8": {"before_finetune": {"perplexity": 30.0},
                   "finetune": {"eval_perplexity": 12.5, "steps": 7, "wall_time_s": 61.4,
                                "time_limit_reached": True}},
        "nha-w32": {"before_finetune": {"perplexity": 25.0}, "finetune": None,
                    "skipped": "out of budget"},
        CONTROL: {"before_finetune": {"perplexity": 10.0},
                  "finetune": {"eval_perplexity": 9.5, "steps": 3, "wall_time_s": 20.0,
                               "time_limit_reached": False}},
        "pretrain": {"steps": 40, "eval_perplexity": 11.25, "train_perplexity": 3.0,
                     "median_tokens_per_s": 1234.0, "wall_time_s": 99.0,
                     "time_limit_reached": False}})
    lines = report.table().splitlines()
    assert lines[2:8] == [
        "| original (full attention) | full | – | 10.00 | – | – | – |",
        "| original, sliding window only | 8 | – | 40.00 | – | – | – |",
        "| original, sliding window only | 32 | – | 20.00 | – | – | – |",
        "| NHA (converted) | 8 | 4 | 30.00 | 12.50 | 700 (time cap) | 61 |",
        "| NHA (converted) | 32 | 4 | 25.00 | – | 0 | 0 |",
        "| original, fine-tuned the same way | full | – | 10.00 | 9.50 | 300 | 20 |"]
    assert lines[9] == ("Pretraining: 40 steps, held-out ppl 11.25 before export, 1,234 "
                        "tokens/s, 99 s.")
    assert (tmp_path / "results.md").read_text().splitlines() == lines


def test_training_summary_leaves_out_the_compiling_record(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"steps": 4}))
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in [{"step": 1, "tokens_per_s": 1000.0}, {"step": 1},
                                       {"step": 2, "tokens_per_s": 10.0},
                                       {"step": 3, "tokens_per_s": 30.0},
                                       {"step": 4, "tokens_per_s": 20.0}]))
    assert training_summary(tmp_path) == {"steps": 4, "median_tokens_per_s": 20.0}


def test_the_last_override_of_a_key_wins():
    overrides = ["train.batch_size=4", "train.batch_size_x=1", "train.batch_size=8"]
    assert _read_last(overrides, "train.batch_size") == "8"


@pytest.mark.parametrize("args, message", [
    (["--windows", "8,8"], r"--windows: \[8\] given more than once"),
    (["--windows", "0"], "--windows: expected integers >= 1"),
    (["--windows", "8,x"], "--windows: expected integers >= 1"),
    (["--slots", "0"], "--slots: expected an integer >= 1, got 0")])
def test_bad_windows_or_slots_are_refused_before_anything_runs(tmp_path, args, message):
    """A window given twice made two `nha-wW` rows of one run directory; `--slots 0` ran
    with the plan's slots under the name of the default."""
    with pytest.raises(ValueError, match=message):
        main(["--size", "tiny", "--out", str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists()
