"""Plot files are drawn on figures that no pyplot backend manages: the caller's backend (a
notebook's inline one) is left as it was, and nothing needs a display."""

import json

import matplotlib
import numpy as np
import pytest

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
