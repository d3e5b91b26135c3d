"""DeepNorm vs Post-LN vs Pre-LN residuals in a deep, narrow stack (PHA issue, item 5).

    python -m experiments.deepnorm_stability --out runs/stability --data ../shared/data
        [--layers 48] [--steps 150] [--learning-rates 1e-3,3e-3,1e-2,3e-2,0.1] [--workers 2]

Trains the same 48-layer byte-level model on WikiText-2 once per (arm, learning rate), changing
only the residual scheme of its blocks (attention → SwiGLU, `layer("sequential", ...)`), with
AdamW at a constant learning rate, **no warm-up and no gradient clipping**. The arms (DeepNet,
Wang et al. 2022, compares DeepNorm with Post-LN; Pre-LN is its stable-but-worse reference):

    deepnorm    LN(α·x + f(x)), α = (2L)^¼, DeepNet's init (Xavier, gain β = (8L)^−¼ on the
                value/output/FFN kernels)
    post_norm   LN(x + f(x)) with the same Xavier init and gain 1 (α = β = 1): DeepNet's
                Post-LN baseline, differing from `deepnorm` only in α and β
    pre_norm    x + f(LN(x)) with the library's init (normal 0.02, outputs / √(2L))

`--workers` processes run the grid (each one run after another). Writes each run under
`OUT/<arm>-lr<lr>/`, the table to `OUT/stability.json` and `OUT/stability.md`, and the plot
(final loss against learning rate; loss curves at the largest rate) to `OUT/stability.png`.
A run whose loss or gradient becomes non-finite is recorded as diverged at that step.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from experiments.cli import run_with_logging
from experiments.configs.lm import DATA, WIKITEXT2_RAW, require_files
from experiments.files import check_same_config, number_id
from experiments.help_text import first_paragraph
from hybrid_jax.config import ExperimentConfig, ModelConfig, TrainConfig, layer
from hybrid_jax.files import write_atomic
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.trainer import NonFiniteLossError, train

ARMS = {
    "deepnorm": dict(residual="deepnorm"),
    "post_norm": dict(residual="deepnorm", deepnorm_alpha=1.0, deepnorm_beta=1.0),
    "pre_norm": dict(residual="pre_norm"),
}
LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def experiment(arm: str, *, layers: int, steps: int, learning_rate: float,
               data_dir: str = DATA) -> ExperimentConfig:
    block = layer("sequential", branches=("attention", "ffn"), **ARMS[arm])
    model = ModelConfig(layers=(block,) * layers, vocab_size=257, d_model=32, num_heads=2,
                        ffn_dim=64, scan_layers=True)
    train_config = TrainConfig(steps=steps, batch_size=16, learning_rate=learning_rate,
                               warmup_steps=0, min_lr_ratio=1.0, grad_clip=None, log_every=5,
                               eval_batches=4, checkpoint_every=0)
    return ExperimentConfig(name=f"deepnorm-stability-{arm}", model=model,
                            data=replace(WIKITEXT2_RAW, seq_len=64,
                                         path=f"{data_dir}/wikitext-2-raw/wiki.train.raw",
                                         eval_path=f"{data_dir}/wikitext-2-raw/wiki.valid.raw"),
                            train=train_config)


def run_name(arm: str, learning_rate: float) -> str:
    return f"{arm}-lr{number_id(learning_rate)}"


def parse_learning_rates(text: str) -> list[float]:
    """"1e-3,3e-3" → [0.001, 0.003]; each rate > 0 and given once (its run directory is
    named by it: a rate given twice was trained twice into one directory, concurrently)."""
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--learning-rates: expected numbers separated by commas, got "
                         f"{text!r}") from None
    if not all(rate > 0 and math.isfinite(rate) for rate in rates):
        raise ValueError(f"--learning-rates: expected rates > 0, got {text!r}")
    names = [number_id(rate) for rate in rates]
    repeated = sorted({float(n) for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--learning-rates: {repeated} given more than once in {text!r}")
    return rates


def finished_row(run_dir: Path, config: ExperimentConfig, settings: str = "") -> dict | None:
    """The `row.json` of a run already made in `run_dir` (None without one): only of a run of
    `config` (`check_same_config`), else a row of other settings (`settings` names them in the
    error) would be read into this call's table, labelled with this call's settings."""
    if not (run_dir / "row.json").is_file():
        return None
    check_same_config(run_dir, config, marker="row.json", hint=f"use another --out{settings}")
    return json.loads((run_dir / "row.json").read_text())


def run_one(out: Path, arm: str, learning_rate: float, *, layers: int, steps: int,
            data_dir: str) -> dict:
    """One (arm, learning rate) run; its row of the table, also written to `RUN/row.json`
    (a run that has one is not made again: an interrupted grid continues)."""
    run_dir = out / run_name(arm, learning_rate)
    config = experiment(arm, layers=layers, steps=steps, learning_rate=learning_rate,
                        data_dir=data_dir)
    row = finished_row(run_dir, config, " (--layers, --steps or --data)")
    if row is not None:
        return row
    try:
        result, diverged = train(config, run_dir, progress=False, force=True), None
    except NonFiniteLossError as error:
        result, diverged = {}, error.step
    losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
    row = {"arm": arm, "learning_rate": learning_rate, "diverged_at_step": diverged,
           "first_train_loss": losses[0] if losses else math.nan,
           "max_train_loss": max(losses) if losses else math.nan,
           "final_train_loss": losses[-1] if losses else math.nan,
           "eval_loss": result.get("eval_loss")}
    write_atomic(run_dir / "row.json", json.dumps(row))  # read back by later calls
    print(json.dumps(row), flush=True)
    return row


def run_grid(out: Path, *, layers: int, steps: int, learning_rates: list[float],
             data_dir: str, workers: int) -> dict:
    """Every (arm, learning rate), `workers` processes at a time; the summary."""
    grid = [(arm, lr) for lr in learning_rates for arm in ARMS]
    shards = [grid[i::workers] for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "experiments.deepnorm_stability",
                               "--out", str(out), "--layers", str(layers), "--steps", str(steps),
                               "--data", data_dir, "--only",
                               ";".join(f"{arm},{number_id(lr)}" for arm, lr in shard)])
             for shard in shards if shard]
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"a worker failed (exit {proc.returncode}): {proc.args}")
    rows = [json.loads((out / run_name(arm, lr) / "row.json").read_text()) for arm, lr in grid]
    summary = {"layers": layers, "steps": steps, "warmup_steps": 0, "grad_clip": None,
               "learning_rates": learning_rates, "results": rows}
    write_atomic(out / "stability.json", json.dumps(summary, indent=2))
    write_atomic(out / "stability.md", markdown_table(rows, learning_rates))
    plot(out, rows, learning_rates)
    return summary


def _cell(row: dict) -> str:
    if row["diverged_at_step"] is not None:
        return f"diverged (step {row['diverged_at_step']})"
    return f"{row['final_train_loss']:.3f} / {row['eval_loss']:.3f}"


def markdown_table(rows: list[dict], learning_rates: list[float]) -> str:
    """Arms × learning rates: final train loss / eval loss (nats per byte), or the divergence."""
    cells = {(r["arm"], r["learning_rate"]): _cell(r) for r in rows}
    lines = ["| arm | " + " | ".join(f"lr {number_id(lr)}" for lr in learning_rates) + " |",
             "|---|" + "---|" * len(learning_rates)]
    lines += [f"| {arm} | " + " | ".join(cells[arm, lr] for lr in learning_rates) + " |"
              for arm in ARMS]
    return "\n".join(lines) + "\n"


def loss_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, train loss) of a run's logged metrics."""
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir) if "loss" in r]


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot(out: Path, rows: list[dict], learning_rates: list[float]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        finished = [r for r in mine if r["diverged_at_step"] is None]
        line, = left.plot([r["learning_rate"] for r in finished],
                          [r["final_train_loss"] for r in finished], marker="o", label=arm)
        for r in mine:
            if r["diverged_at_step"] is not None:
                left.plot(r["learning_rate"], 6.0, marker="x", markersize=9,
                          color=line.get_color())
        points = loss_curve(out / run_name(arm, max(learning_rates)))
        if points:
            right.plot(*zip(*points, strict=True), label=arm, color=line.get_color())
    left.set(xscale="log", xlabel="learning rate (constant, no warm-up)",
             ylabel="final train loss (nats/byte)", title="x: diverged (non-finite)")
    right.set(yscale="log", xlabel="step", ylabel="train loss",
              title=f"loss at lr {number_id(max(learning_rates))}")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out / "stability.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning-rates", default=",".join(map(number_id, LEARNING_RATES)))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", default=DATA, help="folder holding wikitext-2-raw/")
    parser.add_argument("--only", default="", help="(a worker) 'arm,lr;arm,lr' runs to make")
    args = parser.parse_args(argv)
    learning_rates = parse_learning_rates(args.learning_rates)
    if args.workers < 1:
        raise ValueError(f"--workers: expected an integer >= 1, got {args.workers}")
    data = experiment("deepnorm", layers=1, steps=1, learning_rate=1.0, data_dir=args.data).data
    require_files(data.path, data.eval_path)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:
        for item in args.only.split(";"):
            arm, lr = item.split(",")
            run_one(args.out, arm, float(lr), layers=args.layers, steps=args.steps,
                    data_dir=args.data)
        return 0
    summary = run_grid(args.out, layers=args.layers, steps=args.steps,
                       learning_rates=learning_rates, data_dir=args.data, workers=args.workers)
    print(markdown_table(summary["results"], learning_rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
