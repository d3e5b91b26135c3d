"""The serial-DeepNorm diagnosis script: its arms end to end (tiny, on a tiny corpus, slow);
the arms' constants, a row from stubbed training, the summary and the --runs check (default)."""

from __future__ import annotations

import json
import lzma

import pytest

from experiments import pha_serial_deepnorm
from hybrid_jax.nn.blocks import deepnorm_constants
from tests.helpers import stub_train


@pytest.mark.slow
def test_two_arms_train_and_are_summarised(tmp_path):
    corpus = tmp_path / "data" / "gutenberg"
    corpus.mkdir(parents=True)
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                   for i in range(400))
    for name in ("train-00.txt.xz", "valid.txt.xz"):
        (corpus / name).write_bytes(lzma.compress(text.encode()))
    out = tmp_path / "out"
    assert pha_serial_deepnorm.main(["--out", str(out), "--runs",
                                     "deepnorm-subl,1e-3;prenorm,1e-3", "--d-model", "64",
                                     "--steps", "3", "--warmup", "1", "--seq-len", "16",
                                     "--batch-size", "8", "--data", str(tmp_path / "data")]) == 0
    rows = {r["arm"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert rows["deepnorm-subl"]["alpha"] == pytest.approx(30 ** 0.25)
    assert rows["prenorm"]["alpha"] is None
    assert all(r["final_train_loss"] > 0 and r["nonfinite_at_step"] is None
               for r in rows.values())


def test_arms_constants_are_deepnets():
    """deepnorm-blocks: DeepNet's decoder formula over the 10 blocks (k = 2); deepnorm-subl:
    the library's constants over the 30 sublayers (k = 3); post-ln: α = β = 1."""
    arms = pha_serial_deepnorm.ARMS
    got = {arm: (arms[arm].get("deepnorm_alpha"), arms[arm].get("deepnorm_beta"))
           for arm in arms}
    assert got["deepnorm-blocks"] == pytest.approx(deepnorm_constants(10, 2))
    assert got["deepnorm-subl"] == pytest.approx(deepnorm_constants(10, 3))
    assert got["deepnorm-subl"] == pytest.approx((30 ** 0.25, 120 ** -0.25))
    assert got["post-ln"] == (1.0, 1.0) and got["prenorm"] == (None, None)


KWARGS = dict(d_model=64, steps=30, warmup=1, seq_len=16, batch_size=2, data_dir=None)


@pytest.mark.parametrize("losses, nonfinite_at, diverged", [
    ([5.0, 3.0, 3.4], None, False),   # 0.4 above its lowest: not diverged
    ([5.0, 3.0, 3.6], None, True),    # 0.6 above: diverged (the ablation's collapse)
    ([5.0, 4.0], 20, True)])          # a non-finite loss
def test_run_one_row_and_divergence(tmp_path, monkeypatch, losses, nonfinite_at, diverged):
    stub_train(monkeypatch, pha_serial_deepnorm, losses, nonfinite_at=nonfinite_at)
    row = pha_serial_deepnorm.run_one(tmp_path, "post-ln", 2e-3, **KWARGS)
    assert row == {"arm": "post-ln", "learning_rate": 2e-3, "alpha": 1.0, "beta": 1.0,
                   "nonfinite_at_step": nonfinite_at, "min_train_loss": min(losses),
                   "final_train_loss": losses[-1],
                   "eval_loss": None if nonfinite_at else 3.25, "diverged": diverged}
    # Read again, not remade, only while its config.json (written by train) is this call's.
    monkeypatch.setattr(pha_serial_deepnorm, "train", None)
    assert pha_serial_deepnorm.run_one(tmp_path, "post-ln", 2e-3, **KWARGS) == row
    with pytest.raises(ValueError, match="post-ln-lr0.002: made with another configuration"):
        pha_serial_deepnorm.run_one(tmp_path, "post-ln", 2e-3, **{**KWARGS, "steps": 60})


def test_summary_keeps_earlier_rows_and_replaces_rerun_ones(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    old = [{"arm": "prenorm", "learning_rate": 2e-3, "final_train_loss": 1.0},
           {"arm": "post-ln", "learning_rate": 2e-3, "final_train_loss": 9.0}]
    (out / "summary.json").write_text(json.dumps({"rows": old}))
    monkeypatch.setattr(pha_serial_deepnorm, "run_one", lambda out, arm, lr, **kwargs: {
        "arm": arm, "learning_rate": lr, "final_train_loss": 2.0})
    monkeypatch.setattr(pha_serial_deepnorm, "plot", lambda *args: None)
    data = tmp_path / "data"  # main checks the corpus files exist before any run
    (data / "gutenberg").mkdir(parents=True)
    for name in ("train-00.txt.xz", "valid.txt.xz"):
        (data / "gutenberg" / name).touch()
    assert pha_serial_deepnorm.main(["--out", str(out), "--runs", "post-ln,2e-3;post-ln,1e-3",
                                     "--data", str(data)]) == 0
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert [(r["arm"], r["learning_rate"], r["final_train_loss"]) for r in rows] == [
        ("prenorm", 2e-3, 1.0), ("post-ln", 2e-3, 2.0), ("post-ln", 1e-3, 2.0)]
    # Rows (and row.json files) of another width were kept under this call's d_model.
    with pytest.raises(ValueError, match=r"its runs had \{'d_model': 128\}; expected this "
                                         r"call's \{'d_model': 64\}"):
        pha_serial_deepnorm.main(["--out", str(out), "--runs", "prenorm,2e-3",
                                  "--d-model", "64", "--data", str(data)])


def test_a_missing_corpus_is_named_before_any_run(tmp_path, monkeypatch):
    """Without the Gutenberg files the first run died in the data pipeline, its error naming
    the file but not --data or HYBRID_JAX_DATA."""
    monkeypatch.setattr(pha_serial_deepnorm, "run_one", None)  # must not be reached
    with pytest.raises(FileNotFoundError, match=r"gutenberg/train-00\.txt\.xz not found: "
                                                r"--data DIR names the data folder"):
        pha_serial_deepnorm.main(["--out", str(tmp_path / "out"), "--runs", "prenorm,2e-3",
                                  "--data", str(tmp_path / "none")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("runs, message", [
    ("prenorm,2e-3;deepnorm,2e-3", r"--runs: unknown arm 'deepnorm' in 'deepnorm,2e-3'"),
    ("prenorm,2e-3;prenorm,0.002", r"--runs: \('prenorm', 0.002\) given more than once"),
    ("prenorm", "--runs: expected 'arm,learning rate'"),
    ("prenorm,0", "--runs: expected 'arm,learning rate'")])
def test_bad_runs_are_refused_before_training(tmp_path, runs, message):
    """An unknown arm was a KeyError after the runs before it had trained."""
    with pytest.raises(ValueError, match=message):
        pha_serial_deepnorm.main(["--out", str(tmp_path / "out"), "--runs", runs])
    assert not (tmp_path / "out").exists()
