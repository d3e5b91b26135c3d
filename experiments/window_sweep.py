"""Evaluate one trained run at several attention windows: a table and a plot.

NHA's "duality": one set of parameters runs as a pure gated-slot recurrence (window 0), as a
hybrid (small windows) or as full causal attention (window `full`), with no retraining
(`LanguageModel.with_window`). Works for any model whose blocks have a `window` option
(sliding-window attention too, for windows >= 1).

    hybrid-jax eval RUN_DIR --windows 0,4,16,64,full [--layers 0,1] [--sweep-out DIR]
    python -m experiments.window_sweep RUN_DIR --windows 0,4,16,64,full

Writes `window_sweep.md`, `window_sweep.csv` and `window_sweep.png` (loss and accuracy against
the window) into `RUN_DIR/window_sweep/` unless told otherwise; each row names the checkpoint
step it evaluated (`--step`, default the latest).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from flax import nnx

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.files import write_atomic

FULL = "full"
# `step`: the checkpoint each row evaluated (a half-trained run's rows look like any other).
COLUMNS = ("window", "step", "loss", "perplexity", "accuracy", "tokens")


def parse_windows(text: str) -> list[int | None]:
    """"0,4,16,full" → [0, 4, 16, None] (`full` or `none`: full causal attention)."""
    windows = []
    for item in text.replace(" ", "").split(","):
        if item.lower() in (FULL, "none"):
            windows.append(None)
        elif item.isdigit():
            windows.append(int(item))
        else:
            raise ValueError(f"--windows: expected integers >= 0 or '{FULL}' separated by "
                             f"commas, got {item!r} in {text!r}")
    if not windows:
        raise ValueError("--windows: no window given")
    _refuse_repeats("--windows", windows, text)
    return windows


def _refuse_repeats(flag: str, items: Sequence[int | None], text: str) -> None:
    repeated = sorted({FULL if i is None else i for i in items if items.count(i) > 1}, key=str)
    if repeated:
        raise ValueError(f"{flag}: {repeated} given more than once in {text!r}")


def parse_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        layers = [int(x) for x in text.replace(" ", "").split(",")]
    except ValueError:
        raise ValueError(f"--layers: expected layer indices separated by commas, got {text!r}"
                         ) from None
    _refuse_repeats("--layers", layers, text)
    return layers


def window_sweep(run_dir: str | Path, windows: Sequence[int | None], *,
                 layers: Sequence[int] | None = None, step: int | None = None,
                 batches: int | None = None, overrides: Sequence[str] = (),
                 on_row: Callable[[list[dict]], object] | None = None) -> list[dict]:
    """Held-out metrics of a run's checkpoint at every window (one row per window, with the
    checkpoint's `step`: default the latest).

    `layers`: the layers whose window changes (default: every layer with a window option).
    `batches`: eval batches (default the run's `train.eval_batches`; 0: the whole held-out set).
    `on_row`: called with the rows so far after each window (`run` writes them: a window that
    fails, e.g. `full` out of memory, keeps the rows before it).
    """
    from experiments.cli import load_for_eval
    from hybrid_jax.train.trainer import evaluate

    with load_for_eval(Path(run_dir), overrides, step, batches,
                       "eval --windows") as (ts, step, held_out, words):
        model, optimizer = nnx.merge(ts.graphdef, ts.state)
        rows = []
        for window in windows:
            graphdef, state = nnx.split((model.with_window(window, layers=layers), optimizer))
            windowed = dataclasses.replace(ts, graphdef=graphdef, state=state)
            metrics = evaluate(windowed, held_out, num_words=words)
            rows.append({"window": FULL if window is None else window, "step": step,
                         **metrics})
            if on_row is not None:
                on_row(rows)
    return rows


def _format(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_results(rows: Sequence[dict], out_dir: str | Path, *, title: str = "") -> list[Path]:
    """`window_sweep.md` (a Markdown table), `.csv` and `.png` in `out_dir`; returns the paths."""
    tables = write_tables(rows, out_dir, title=title)
    return [*tables, _plot(rows, Path(out_dir) / "window_sweep.png", title)]


def write_tables(rows: Sequence[dict], out_dir: str | Path, *, title: str = "") -> list[Path]:
    """`window_sweep.md` and `.csv` in `out_dir` (no plot: cheap enough after every row)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = [c for c in COLUMNS if c in rows[0]] + sorted(set(rows[0]) - set(COLUMNS))
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(_format(row.get(c, "")) for c in columns) + " |" for row in rows]
    markdown = write_atomic(out_dir / "window_sweep.md",
                            (f"# {title}\n\n" if title else "") + "\n".join(table) + "\n")
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return [markdown, write_atomic(out_dir / "window_sweep.csv", text.getvalue())]


def _plot(rows: Sequence[dict], path: Path, title: str) -> Path:
    from hybrid_jax.train.plot import new_figure, save_figure

    labels = [str(row["window"]) for row in rows]
    positions = range(len(rows))  # even spacing: windows span orders of magnitude, `full` last
    fig, axes = new_figure(1, 2, figsize=(9, 3.6))
    for ax, key, name in ((axes[0], "loss", "eval loss (nats/token)"),
                          (axes[1], "accuracy", "eval accuracy")):
        ax.plot(positions, [row[key] for row in rows], marker="o")
        ax.set_xticks(list(positions), labels)
        ax.set_xlabel("window (0: slots only; full: causal attention)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def run(run_dir: Path, windows_text: str, *, layers_text: str | None = None,
        out: Path | None = None, step: int | None = None, batches: int | None = None,
        overrides: Sequence[str] = ()) -> list[dict]:
    """The command-line entry: sweep, print the table, write the files."""
    out = out or run_dir / "window_sweep"
    title = f"{run_dir.name}: held-out metrics against the window"

    def write_rows(rows: list[dict]) -> None:
        # The tables are rewritten after each window; an earlier sweep's plot beside them would
        # show other rows if this one fails before its own plot. A sweep refused before its
        # first row (a bad --windows, a missing step) leaves the earlier one whole.
        if len(rows) == 1:
            (out / "window_sweep.png").unlink(missing_ok=True)
        write_tables(rows, out, title=title)

    rows = window_sweep(run_dir, parse_windows(windows_text), layers=parse_layers(layers_text),
                        step=step, batches=batches, overrides=overrides, on_row=write_rows)
    paths = write_results(rows, out, title=title)
    print(paths[0].read_text(), end="")
    print("wrote " + ", ".join(str(p) for p in paths))
    finite = [row for row in rows if math.isfinite(row["loss"])]
    # Not the first window when none is finite: it was named "lowest" with a NaN loss.
    print(f"lowest loss at window {min(finite, key=lambda r: r['loss'])['window']}" if finite
          else "no window gave a finite loss")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--windows", required=True, help="e.g. 0,4,16,64,full")
    parser.add_argument("--layers", default=None, help="layer indices (default: all windowed)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    args = parser.parse_args(argv)
    run(args.run_dir, args.windows, layers_text=args.layers, out=args.out, step=args.step,
        batches=args.batches)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
