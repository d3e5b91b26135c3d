"""experiments/deepnorm_stability.py without training: the arms' configs, a row from a run's
metrics (train stubbed), the table, the grid split over workers, and its arguments checked."""

from __future__ import annotations

import json

import pytest

from experiments import deepnorm_stability as ds
from tests.helpers import stub_train


def test_arms_differ_only_in_the_residual_scheme():
    configs = {arm: ds.experiment(arm, layers=6, steps=5, learning_rate=1e-2) for arm in ds.ARMS}
    options = {arm: dict(c.model.layers[0].options) for arm, c in configs.items()}
    assert options["deepnorm"]["residual"] == "deepnorm"
    assert "deepnorm_alpha" not in options["deepnorm"]  # the library's (2L)^¼, (8L)^−¼
    assert (options["post_norm"]["deepnorm_alpha"], options["post_norm"]["deepnorm_beta"]) == (
        1.0, 1.0)
    assert options["pre_norm"]["residual"] == "pre_norm"
    for c in configs.values():
        assert len(c.model.layers) == 6 and c.train.learning_rate == 1e-2
        # a constant rate, no warm-up, no clipping: what the experiment is about
        assert (c.train.warmup_steps, c.train.min_lr_ratio, c.train.grad_clip) == (0, 1.0, None)
    assert len({(c.data, c.train) for c in configs.values()}) == 1


def test_run_one_row(tmp_path, monkeypatch):
    stub_train(monkeypatch, ds, [5.0, 6.0, 3.0, 2.0], eval_loss=2.5, every=5)
    row = ds.run_one(tmp_path, "deepnorm", 3e-3, layers=2, steps=20, data_dir="data")
    assert row == {"arm": "deepnorm", "learning_rate": 3e-3, "diverged_at_step": None,
                   "first_train_loss": 5.0, "max_train_loss": 6.0, "final_train_loss": 2.0,
                   "eval_loss": 2.5}
    assert json.loads((tmp_path / "deepnorm-lr0.003" / "row.json").read_text()) == row
    monkeypatch.setattr(ds, "train", None)  # a run with a row is not made again
    assert ds.run_one(tmp_path, "deepnorm", 3e-3, layers=2, steps=20, data_dir="data") == row
    # ... unless it was made with another configuration (its config.json, as train writes it).
    with pytest.raises(ValueError, match="deepnorm-lr0.003: made with another configuration"):
        ds.run_one(tmp_path, "deepnorm", 3e-3, layers=4, steps=20, data_dir="data")
    # A row whose config.json is gone cannot be checked: it was read, whatever made it.
    (tmp_path / "deepnorm-lr0.003" / "config.json").unlink()
    with pytest.raises(ValueError, match="deepnorm-lr0.003: holds row.json but no config.json"):
        ds.run_one(tmp_path, "deepnorm", 3e-3, layers=2, steps=20, data_dir="data")


def test_run_one_records_the_divergence_step(tmp_path, monkeypatch):
    stub_train(monkeypatch, ds, [5.0, 9.0], nonfinite_at=12, every=5)
    row = ds.run_one(tmp_path, "post_norm", 0.1, layers=2, steps=20, data_dir="data")
    assert row["diverged_at_step"] == 12 and row["eval_loss"] is None
    assert (row["max_train_loss"], row["final_train_loss"]) == (9.0, 9.0)


def test_markdown_table_cells():
    rows = [{"arm": arm, "learning_rate": lr, "diverged_at_step": None,
             "final_train_loss": 1.0 + i + j / 10, "eval_loss": 2.0 + i + j / 10}
            for i, arm in enumerate(ds.ARMS) for j, lr in enumerate([1e-3, 1e-2])]
    rows[3]["diverged_at_step"] = 15  # post_norm at 1e-2
    assert ds.markdown_table(rows, [1e-3, 1e-2]).splitlines() == [
        "| arm | lr 0.001 | lr 0.01 |", "|---|---|---|",
        "| deepnorm | 1.000 / 2.000 | 1.100 / 2.100 |",
        "| post_norm | 2.000 / 3.000 | diverged (step 15) |",
        "| pre_norm | 3.000 / 4.000 | 3.100 / 4.100 |"]


def test_run_grid_makes_every_run_once(tmp_path, monkeypatch):
    """The workers' `--only` lists cover the grid, each (arm, rate) once, exactly (rates that
    differ past 6 digits were one `:g` name: one run directory, a worker training the rounded
    rate); the table is read back in grid order."""
    made = []

    class Worker:
        def __init__(self, args):
            self.args, self.returncode = args, 0
            for item in args[args.index("--only") + 1].split(";"):
                arm, lr = item.split(",")
                made.append((arm, float(lr)))
                run_dir = tmp_path / ds.run_name(arm, float(lr))
                run_dir.mkdir()
                (run_dir / "row.json").write_text(json.dumps({
                    "arm": arm, "learning_rate": float(lr), "diverged_at_step": None,
                    "final_train_loss": 1.0, "eval_loss": 1.5}))

        def wait(self):
            return 0

    monkeypatch.setattr(ds.subprocess, "Popen", Worker)
    monkeypatch.setattr(ds, "plot", lambda *args: None)
    rates = [1e-3, 1.0000001e-3, 0.1]
    summary = ds.run_grid(tmp_path, layers=2, steps=5, learning_rates=rates, data_dir="data",
                          workers=2)
    grid = [(arm, lr) for lr in rates for arm in ds.ARMS]
    assert sorted(made) == sorted(grid)
    assert [(r["arm"], r["learning_rate"]) for r in summary["results"]] == grid
    assert json.loads((tmp_path / "stability.json").read_text()) == summary
    table = (tmp_path / "stability.md").read_text()
    assert table.count("1.000 / 1.500") == len(grid)
    assert table.startswith("| arm | lr 0.001 | lr 0.0010000001 | lr 0.1 |")


@pytest.mark.parametrize("args, message", [
    (["--learning-rates", "1e-3,0.001"], r"--learning-rates: \[0.001\] given more than once"),
    (["--learning-rates", "1e-3,-1"], "--learning-rates: expected rates > 0"),
    (["--learning-rates", "1e-3,nan"], "--learning-rates: expected rates > 0"),
    (["--workers", "0"], "--workers: expected an integer >= 1, got 0")])
def test_bad_grid_arguments_are_refused(tmp_path, monkeypatch, args, message):
    """A rate given twice had two workers train into one run directory at once."""
    def no_worker(args):
        raise AssertionError(f"a worker was started: {args}")

    monkeypatch.setattr(ds.subprocess, "Popen", no_worker)
    with pytest.raises(ValueError, match=message):
        ds.main(["--out", str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists()


def test_a_missing_corpus_is_named_before_any_worker(tmp_path, monkeypatch):
    """Without the WikiText-2 files each worker died with a traceback in the data pipeline and
    the grid with `RuntimeError: a worker failed`."""
    def no_worker(args):
        raise AssertionError(f"a worker was started: {args}")

    monkeypatch.setattr(ds.subprocess, "Popen", no_worker)
    monkeypatch.delenv("HYBRID_JAX_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match=r"wikitext-2-raw/wiki\.train\.raw not found: "
                       r"--data DIR names the data folder \(default .*HYBRID_JAX_DATA=DIR\)"):
        ds.main(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "none")])
    assert not (tmp_path / "out").exists()
