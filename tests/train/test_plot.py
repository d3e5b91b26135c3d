"""Plot files are drawn on figures that no pyplot backend manages: the caller's backend (a
notebook's inline one) is left as it was, and nothing needs a display."""

import matplotlib
import numpy as np

from experiments.window_sweep import write_results
from hybrid_jax.train.mixing import plot_mixing


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
