"""Why the serial PHA stack with DeepNorm diverged in the Gutenberg ablation (issue 16): a
CPU-sized reproduction.

    python -m experiments.pha_serial_deepnorm --out runs/pha-serial
        [--runs "deepnorm-blocks,2e-3;prenorm,2e-3"] [--d-model 128] [--steps 300]
        [--warmup 30] [--seq-len 128] [--batch-size 8] [--data DIR]

Trains `pha-sequential`'s shape (10 blocks of GSS → cosine GQA → Dual-FFN, each sublayer with
its own residual) at a small width on byte-level Gutenberg (`train-00`, held-out `valid`), one
arm after another, changing only the residual scheme and DeepNorm's constants:

    prenorm          x + f(norm(x))                          (pha-sequential-prenorm)
    deepnorm-blocks  norm(α·x + f(x)), α = (2·10)^¼, β = (8·10)^−¼   (the ablation's constants)
    deepnorm-subl    α = 30^¼, β = 120^−¼: DeepNet's count of 30 sublayers (the library's
                     constants for this stack since the fix, `deepnorm_constants(10, 3)`)
    post-ln          α = β = 1 (DeepNet's Post-LN baseline)

Writes `OUT/<arm>/` (the run), `OUT/summary.json` (per arm: first, max, final train loss, eval
loss) and `OUT/loss.png` (train loss against step).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from experiments.cli import run_with_logging
from experiments.configs.lm import GUTENBERG, require_files
from experiments.deepnorm_stability import finished_row, loss_curve, run_name, save_figure
from experiments.files import number_id
from experiments.help_text import first_paragraph
from hybrid_jax.config import ExperimentConfig, ModelConfig, TrainConfig
from hybrid_jax.files import write_atomic
from hybrid_jax.presets import PHA_ABLATIONS, pha_model
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.trainer import NonFiniteLossError, train

DEPTH, SUBLAYERS = 10, 30
ARMS = {
    "prenorm": PHA_ABLATIONS["sequential-prenorm"],
    "deepnorm-blocks": {**PHA_ABLATIONS["sequential"], "deepnorm_alpha": (2 * DEPTH) ** 0.25,
                        "deepnorm_beta": (8 * DEPTH) ** -0.25},
    "deepnorm-subl": {**PHA_ABLATIONS["sequential"], "deepnorm_alpha": SUBLAYERS ** 0.25,
                      "deepnorm_beta": (4 * SUBLAYERS) ** -0.25},
    "post-ln": {**PHA_ABLATIONS["sequential"], "deepnorm_alpha": 1.0, "deepnorm_beta": 1.0},
}
# A run "diverged" when its last logged train loss is this far above its lowest one (the
# ablation's run ended at 6.76 nats, the unigram level of its BPE) or a loss is non-finite.
DIVERGED_RISE = 0.5


def model(arm: str, d_model: int) -> ModelConfig:
    """`pha-sequential`'s 10 blocks at width `d_model` (heads of 64, one key/value head)."""
    return pha_model(d_model, DEPTH, vocab_size=257, num_kv_heads=1,
                     **ARMS[arm]).replace(scan_layers=True)


def experiment(arm: str, *, d_model: int, steps: int, learning_rate: float, warmup: int,
               seq_len: int, batch_size: int, data_dir: str | None) -> ExperimentConfig:
    data = replace(GUTENBERG, seq_len=seq_len)
    if data_dir is not None:
        data = replace(data, path=f"{data_dir}/gutenberg/train-00.txt.xz",
                       eval_path=f"{data_dir}/gutenberg/valid.txt.xz")
    # The ablation's schedule (AdamW, β2 0.95, clip 1, cosine to 10 %), shortened.
    train_config = TrainConfig(steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                               warmup_steps=warmup, min_lr_ratio=0.1, weight_decay=0.1,
                               log_every=10, eval_batches=8, checkpoint_every=0, seed=0)
    return ExperimentConfig(name=f"pha-serial-{arm}", model=model(arm, d_model), data=data,
                            train=train_config)


def parse_runs(text: str) -> list[tuple[str, float]]:
    """"prenorm,2e-3;post-ln,1e-3" → [("prenorm", 0.002), ("post-ln", 0.001)], checked before
    the first run trains: arms known, rates > 0, each run (its directory) named once."""
    runs = []
    for item in text.split(";"):
        arm, _, lr = item.partition(",")
        try:
            rate = float(lr)
        except ValueError:
            rate = math.nan
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"--runs: expected 'arm,learning rate' items (rate > 0) separated "
                             f"by ';', got {item!r} in {text!r}")
        if arm not in ARMS:
            raise ValueError(f"--runs: unknown arm {arm!r} in {item!r}; expected one of "
                             f"{list(ARMS)}")
        runs.append((arm, rate))
    names = [run_name(arm, rate) for arm, rate in runs]
    repeated = sorted({run for run, name in zip(runs, names, strict=True)
                       if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--runs: {', '.join(map(str, repeated))} given more than once in "
                         f"{text!r}")
    return runs


def run_one(out: Path, arm: str, learning_rate: float, **kwargs) -> dict:
    """One run, its summary row (also `RUN/row.json`; a run that has one is not made again)."""
    run_dir = out / run_name(arm, learning_rate)
    config = experiment(arm, learning_rate=learning_rate, **kwargs)
    # Checked per run too: a run interrupted before summary.json was written left rows that
    # the summary's own check cannot see.
    row = finished_row(run_dir, config)
    if row is not None:
        return row
    try:
        result, nonfinite = train(config, run_dir, progress=False, force=True), None
    except NonFiniteLossError as error:
        result, nonfinite = {}, error.step
    losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
    final = losses[-1] if losses else math.nan
    row = {"arm": arm, "learning_rate": learning_rate,
           "alpha": ARMS[arm].get("deepnorm_alpha"), "beta": ARMS[arm].get("deepnorm_beta"),
           "nonfinite_at_step": nonfinite, "min_train_loss": min(losses, default=math.nan),
           "final_train_loss": final, "eval_loss": result.get("eval_loss"),
           "diverged": nonfinite is not None or final > min(losses, default=final)
           + DIVERGED_RISE}
    write_atomic(run_dir / "row.json", json.dumps(row))  # read back by later calls
    print(json.dumps(row), flush=True)
    return row


def plot(out: Path, rows: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for row in rows:
        points = loss_curve(out / run_name(row["arm"], row["learning_rate"]))
        if points:
            label = f"{row['arm']} lr {number_id(row['learning_rate'])}"
            ax.plot(*zip(*points, strict=True), label=label)
    ax.set(xlabel="step", ylabel="train loss (nats/byte)",
           title="serial PHA stack, 10 blocks: residual scheme")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out / "loss.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", default="deepnorm-blocks,2e-3;prenorm,2e-3",
                        help="'arm,lr;arm,lr' runs, one after another")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--data", default=None, help="folder holding gutenberg/ (default: the "
                        "configs' DATA)")
    args = parser.parse_args(argv)
    runs = parse_runs(args.runs)
    settings = {"d_model": args.d_model, "steps": args.steps, "warmup": args.warmup,
                "seq_len": args.seq_len, "batch_size": args.batch_size, "data": args.data}
    summary_path = args.out / "summary.json"
    previous = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    # Its rows (and the runs' row.json, reused by arm and rate) are of its settings: they were
    # kept under this call's settings, a table of two widths or lengths labelled as one.
    differ = {k: previous[k] for k in settings if k in previous and previous[k] != settings[k]}
    if differ:
        raise ValueError(f"{summary_path}: its runs had {differ}; expected this call's "
                         f"{ {k: settings[k] for k in differ} }: use another --out")
    arm, lr = runs[0]
    data = experiment(arm, d_model=args.d_model, steps=args.steps, learning_rate=lr,
                      warmup=args.warmup, seq_len=args.seq_len, batch_size=args.batch_size,
                      data_dir=args.data).data
    require_files(data.path, data.eval_path)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for arm, lr in runs:
        rows.append(run_one(args.out, arm, lr, d_model=args.d_model, steps=args.steps,
                            warmup=args.warmup, seq_len=args.seq_len,
                            batch_size=args.batch_size, data_dir=args.data))
    keep = [r for r in previous.get("rows", []) if (r["arm"], r["learning_rate"]) not in
            {(x["arm"], x["learning_rate"]) for x in rows}]
    rows = keep + rows
    # Whole or not at all: a torn summary.json lost the earlier calls' rows it keeps.
    write_atomic(summary_path, json.dumps({**settings, "rows": rows}, indent=2))
    plot(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
