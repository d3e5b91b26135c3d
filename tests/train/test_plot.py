"""Plot files are drawn on figures that no pyplot backend manages: the caller's backend (a
notebook's inline one) is left as it was, and nothing needs a display."""

import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_hex

from experiments.window_sweep import write_results
from hybrid_jax.train.mixing import plot_mixing
from hybrid_jax.train.plot import plot_runs, run_labels


def test_plots_leave_the_backend_alone(tmp_path):
    before = matplotlib.get_backend()
    matplotlib.use("svg")  # stands in for a notebook's inline backend
    try:
        path = plot_mixing(3, [0, 1], ["attention", "gss"], np.asarray([[0.3, 0.7], [0.6, 0.4]]),
                           tmp_path / "mixing.png")
        rows = [{"window": w, "loss": 1.0 + i, "accuracy": 0.5} for i, w in enumerate([0, 4])]
        sweep_png = write_results(rows, tmp_path / "sweep")[2]
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    for png in (path, sweep_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_labels_tell_apart_runs_of_one_folder_name(tmp_path):
    """A run and its copy elsewhere (both `run`) had one legend label for two curves."""
    for folder, name in [("a/run", "exp"), ("b/run", "run"), ("c/other", "exp")]:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text(json.dumps({"name": name}))
    runs = [tmp_path / "a/run", tmp_path / "b/run", tmp_path / "c/other"]
    assert run_labels(runs) == [f"{runs[0]} (exp)", str(runs[1]), "other (exp)"]


def test_a_run_given_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"run directories given more than once: \['"):
        plot_runs([tmp_path, tmp_path / "sub" / ".."], tmp_path / "c.png")


def test_each_run_has_one_colour_and_a_legend_entry_in_any_panel(tmp_path, monkeypatch):
    """A run with eval records only, beside one with train records only: each keeps its colour
    across panels (each panel's colour cycle restarted: both were blue) and the legend, on the
    train-loss panel, names both in the order given."""
    rows = {"eval_only": [{"step": 4, "eval_loss": 2.0}], "train_only": [{"step": 1, "loss": 3.0},
                                                                         {"step": 2, "loss": 2.5}]}
    for name, records in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                               for r in records))
    figures = []
    monkeypatch.setattr("hybrid_jax.train.plot.save_figure",
                        lambda fig, out: figures.append(fig) or out)
    plot_runs([tmp_path / "eval_only", tmp_path / "train_only"], tmp_path / "runs.png")
    train_ax, eval_ax = figures[0].axes
    colours = {line.get_label(): to_hex(line.get_color()) for ax in (train_ax, eval_ax)
               for line in ax.get_lines()}
    assert colours == {"eval_only": to_hex("C0"), "train_only": to_hex("C1")}
    assert [t.get_text() for t in train_ax.get_legend().get_texts()] == list(rows)


def test_a_failed_plot_write_keeps_the_previous_plot(tmp_path, monkeypatch):
    """The disk fills up mid-write: the plot drawn before is still whole, no .tmp is left."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    out = tmp_path / "runs.png"
    out.write_bytes(b"the previous plot")

    def disk_full(fig, path, **kwargs):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", disk_full)
    with pytest.raises(OSError, match="No space left"):
        plot_runs([tmp_path / "run"], out)
    assert out.read_bytes() == b"the previous plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "runs.png"]


def test_a_plot_into_a_directory_is_refused_naming_it(tmp_path):
    """`--out DIR`: the error named a temporary file (DIR.RANDOM.tmp: Is a directory)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(ValueError, match=f"^{tmp_path / 'run'} is a directory: give the path "):
        plot_runs([tmp_path / "run"], tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
