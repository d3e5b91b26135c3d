"""Loss and perplexity curves of several runs on one PNG (`hybrid-jax plot RUN_DIR ...`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hybrid_jax.files import replacing
from hybrid_jax.train.metrics import read_metrics

# (metrics.jsonl key, panel title); a panel is drawn when some run has the key.
PANELS = (("loss", "train loss"), ("eval_loss", "eval loss (nats/token)"),
          ("eval_perplexity", "eval perplexity"), ("eval_bits_per_byte", "eval bits per byte"))


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Legend labels: each run's folder name and its experiment's name where it differs; runs
    whose folders share a name are told apart by their paths as given."""
    def label(run_dir: Path, where: str) -> str:
        config = run_dir / "config.json"
        name = json.loads(config.read_text()).get("name") if config.is_file() else None
        return where if not name or name == run_dir.name else f"{where} ({name})"

    names = [d.name for d in run_dirs]
    return [label(d, str(d) if names.count(d.name) > 1 else d.name) for d in run_dirs]


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, *, log_y: bool = False) -> Path:
    """Draws each metric of `PANELS` against the step, one line per run; returns `out`."""
    paths = [Path(d) for d in run_dirs]
    resolved = [d.resolve() for d in paths]
    repeated = sorted({str(d) for d, r in zip(paths, resolved, strict=True)
                       if resolved.count(r) > 1})
    if repeated:
        raise ValueError(f"run directories given more than once: {repeated}")
    runs = list(zip(run_labels(paths), (read_metrics(d) for d in paths), strict=True))
    panels = [(key, title) for key, title in PANELS
              if any(key in r for _, records in runs for r in records)]
    if not panels:
        raise ValueError(f"no loss or eval records in {[str(d) for d in run_dirs]}")
    fig, axes = new_figure(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        # A run keeps its colour in every panel, also where an earlier run has no line.
        for color, (label, records) in enumerate(runs):
            points = sorted({r["step"]: r[key] for r in records if key in r}.items())
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if len(points) < 20 else None, markersize=3,
                        label=label, color=f"C{color % 10}")
        ax.set_title(title)
        ax.set_xlabel("step")
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    # One legend of every run in the order given, whichever panels it has lines in.
    lines = {}
    for ax in axes[0]:
        for line, label in zip(*ax.get_legend_handles_labels(), strict=True):
            lines.setdefault(label, line)
    labels = [label for label, _ in runs if label in lines]
    axes[0][0].legend([lines[label] for label in labels], labels, fontsize="small")
    return save_figure(fig, out)


def new_figure(rows: int = 1, cols: int = 1, **subplots):
    """`(figure, axes)` of a matplotlib `Figure` that no pyplot backend manages: drawing files
    needs no display and leaves the caller's backend alone (a notebook's inline plots keep
    showing; `matplotlib.use("Agg")` here would switch them off for the whole process)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=subplots.pop("figsize", None))
    return figure, figure.subplots(rows, cols, **subplots)


def save_figure(fig, out: str | Path) -> Path:
    """Writes a figure of `new_figure` to `out` (folders created), in the format its suffix
    names, through a temporary file renamed over it: a failed write (a full disk) leaves the
    previous plot and no temporary file."""
    from matplotlib import rcParams

    out = Path(out)
    if out.is_dir():  # the rename over it failed naming the temporary file, not `out`
        raise ValueError(f"{out} is a directory: give the path of an image file, e.g. "
                         f"{out / 'plot.png'}")
    fig.tight_layout()
    with replacing(out) as tmp:
        fig.savefig(tmp, dpi=120, format=out.suffix[1:] or rcParams["savefig.format"])
    return out
