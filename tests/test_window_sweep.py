"""`hybrid-jax eval RUN --windows ...`: one checkpoint evaluated at several windows."""

import csv
import json

import pytest

from experiments.cli import main
from experiments.window_sweep import parse_layers, parse_windows

TINY_RUN = ["--set", "train.steps=4", "--set", "train.warmup_steps=2",
            "--set", "train.batch_size=4", "--set", "train.log_every=2",
            "--set", "train.eval_batches=1", "--set", "data.seq_len=16",
            "--set", "data.num_kv_pairs=2", "--set", "train.mesh.data=1", "--set",
            "model.d_model=16", "--set", "model.num_heads=2", "--set", "model.num_slots=4",
            "--set", "model.window=4"]


def test_sweep_writes_a_table_csv_and_plot(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    assert main(["train", "mqar-nha-tiny", "--out", str(run_dir), "--quiet", *TINY_RUN]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--windows", "0,4,full", "--layers", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "| window | step | loss | perplexity | accuracy |" in out
    assert "lowest loss at window" in out
    sweep = run_dir / "window_sweep"
    assert (sweep / "window_sweep.png").stat().st_size > 0
    rows = list(csv.DictReader((sweep / "window_sweep.csv").open()))
    assert [row["window"] for row in rows] == ["0", "4", "full"]
    # Each row names the checkpoint it evaluated: a half-trained run's rows look the same.
    assert [row["step"] for row in rows] == [str(results["steps"])] * 3
    best = min(rows, key=lambda row: float(row["loss"]))["window"]
    assert f"lowest loss at window {best}\n" in out
    # A sweep refused before its first row (a typo, a missing step) deleted the earlier plot.
    assert main(["eval", str(run_dir), "--windows", "4,x"]) == 2
    assert main(["eval", str(run_dir), "--windows", "4", "--step", "3"]) == 2
    assert (sweep / "window_sweep.png").stat().st_size > 0
    # The trained window reproduces the run's own evaluation; the others differ.
    assert float(rows[1]["loss"]) == pytest.approx(results["eval_loss"], rel=1e-5)
    assert float(rows[0]["loss"]) != pytest.approx(float(rows[1]["loss"]), rel=1e-4)
    # A window failing (e.g. `full` out of memory) keeps the rows before it, and no plot of
    # the earlier sweep's rows beside them.
    from hybrid_jax.train import trainer

    evaluate = trainer.evaluate

    def evaluate_until_full(ts, *args, **kwargs):
        if (tmp_path / "second").exists():
            raise MemoryError("out of memory at full")
        (tmp_path / "second").touch()
        return evaluate(ts, *args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate", evaluate_until_full)
    assert main(["eval", str(run_dir), "--windows", "4,full"]) == 2
    kept = list(csv.DictReader((sweep / "window_sweep.csv").open()))
    assert [(r["window"], r["loss"]) for r in kept] == [("4", rows[1]["loss"])]
    assert not (sweep / "window_sweep.png").exists()
    monkeypatch.undo()
    assert main(["eval", str(run_dir), "--windows", "4", "--layers", "7"]) == 2
    assert "layer 7 has no window option" in capsys.readouterr().err


def test_bad_window_lists_are_named():
    assert parse_windows("0, 4,None") == parse_windows("0,4,full") == [0, 4, None]
    # A repeat measured the same window twice: two equal rows in the table.
    with pytest.raises(ValueError, match=r"--windows: \['full'\] given more than once"):
        parse_windows("4,full,none")
    with pytest.raises(ValueError, match=r"--windows: \[4\] given more than once"):
        parse_windows("4,8,4")
    with pytest.raises(ValueError, match=r"--layers: \[1\] given more than once in '1,0,1'"):
        parse_layers("1,0,1")
    with pytest.raises(ValueError, match="expected integers >= 0 or 'full'"):
        parse_windows("0,-2")


def test_no_window_is_named_lowest_when_every_loss_is_nan(tmp_path, monkeypatch, capsys):
    from experiments import window_sweep

    monkeypatch.setattr(window_sweep, "window_sweep", lambda *args, **kwargs: [
        {"window": 0, "step": 4, "loss": float("nan")},
        {"window": "full", "step": 4, "loss": float("nan")}])
    monkeypatch.setattr(window_sweep, "_plot", lambda rows, path, title: path)
    window_sweep.run(tmp_path, "0,full", out=tmp_path / "out")
    out = capsys.readouterr().out
    assert "no window gave a finite loss" in out and "lowest loss" not in out
