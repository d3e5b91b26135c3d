"""The learned branch weights of parallel blocks, per layer, from a run's logged diagnostics.

A parallel block with `mixing="learned"` reports `mixing_<branch>` (`nn/diagnostics.py`); the
trainer logs them as `diag/blocks.<layer>.mixing_<branch>` in `metrics.jsonl`, or, for a model
with `scan_layers=True`, as `diag/blocks.<i>.mixing_<branch>/<g>`: block i of scanned group g,
layer `g · period + i` (the period of the layers in the run's `config.json`).
`hybrid-jax inspect mixing RUN_DIR` prints the latest weights and draws them as a heat map
(layers × branches).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from hybrid_jax.nn.diagnostics import PREFIX
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.plot import new_figure, save_figure

_KEY = re.compile(re.escape(PREFIX) + r"blocks\.(\d+)\.mixing_(\w+)(?:/(\d+))?$")


def _layer_period(run_dir: Path) -> int:
    """The period of the run's layer pattern (blocks per scanned group), from `config.json`."""
    from hybrid_jax.config import ExperimentConfig, from_dict
    from hybrid_jax.nn.lm import layer_period

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{run_dir}: the mixing weights come from a scanned model, whose layer "
                         "numbers need the run's config.json, which is missing")
    return layer_period(from_dict(ExperimentConfig, json.loads(path.read_text())).model.layers)


def mixing_weights(run_dir: str | Path) -> tuple[int, list[int], list[str], np.ndarray]:
    """`(step, layers, branches, weights [layers, branches])` of the latest logged record that
    has mixing weights; a branch a layer lacks is NaN."""
    records = [r for r in read_metrics(run_dir) if any(_KEY.match(k) for k in r)]
    if not records:
        raise ValueError(f"{run_dir}: no mixing weights in metrics.jsonl (expected keys "
                         f"'{PREFIX}blocks.N.mixing_BRANCH' from parallel blocks with "
                         "mixing='learned')")
    record = records[-1]
    matches = [(m, v) for k, v in record.items() if (m := _KEY.match(k))]
    period = _layer_period(run_dir) if any(m[3] is not None for m, _ in matches) else 0
    found = {(int(m[1]) + period * int(m[3] or 0), m[2]): v for m, v in matches}
    layers = sorted({layer for layer, _ in found})
    branches = sorted({branch for _, branch in found})
    weights = np.full((len(layers), len(branches)), np.nan)
    for (layer, branch), value in found.items():
        weights[layers.index(layer), branches.index(branch)] = value
    return int(record["step"]), layers, branches, weights


def format_mixing(step: int, layers: list[int], branches: list[str], weights: np.ndarray) -> str:
    head = f"mixing weights at step {step}\nlayer " + " ".join(f"{b:>10s}" for b in branches)
    rows = [f"{layer:5d} " + " ".join(f"{w:10.4f}" for w in row)
            for layer, row in zip(layers, weights, strict=True)]
    return "\n".join([head, *rows])


def plot_mixing(step: int, layers: list[int], branches: list[str], weights: np.ndarray,
                out: str | Path) -> Path:
    fig, ax = new_figure(figsize=(1.6 + 1.2 * len(branches), 1.2 + 0.35 * len(layers)))
    image = ax.imshow(weights, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(branches)), branches)
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("branch")
    ax.set_ylabel("layer")
    ax.set_title(f"mixing weights (step {step})")
    for i in range(len(layers)):
        for j in range(len(branches)):
            ax.text(j, i, f"{weights[i, j]:.2f}", ha="center", va="center", color="w",
                    fontsize=7)
    fig.colorbar(image, ax=ax)
    return save_figure(fig, out)
