"""Oryx retrieval under mixed-mode inference: recall of trained runs per mode schedule.

    python -m experiments.oryx_modes RUN_DIR [RUN_DIR ...] [--batches N] [--out results.json]
                                     [--set data.eval_seq_len=256 ...]

For each run (MQAR or needle in a haystack, trained in mixed mode: `experiments/configs/
oryx.py`) and each schedule — all linear, all attention, and linear everywhere except the
scored tokens (MQAR's queries, the needle's query: attention only where the answer is read,
i.e. linear prefill + attention on the query tokens) — prints recall (accuracy on the scored
positions) and the fraction of tokens in attention mode, and writes them as JSON (`--out`;
each run's `modes.json` when no `--set` changes its data). `--set` overrides the runs' configs,
e.g. a longer haystack at evaluation. A run of a model without Oryx layers (a single-mixer
baseline, `<task>-baseline-*` in `experiments/configs/oryx.py`) is evaluated once, as the
schedule "single mixer" (attention fraction 1 for a transformer, 0 for a linear model).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from experiments.run import read_experiment
from hybrid_jax.config import ModelConfig, apply_overrides
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import bind_data, evaluate, held_out_set, restore_train_state

SCHEDULES = {"linear": "linear", "attention": "attention",
             "linear + attention on the queries": "scored=attention,other=linear"}
SINGLE_MIXER = "single mixer"


def is_oryx(model: ModelConfig) -> bool:
    return any(spec.type == "oryx" for spec in model.layers)


def run_modes(run_dir: Path, batches: int, overrides=()) -> dict[str, dict[str, float]]:
    """{schedule: {recall, attention_fraction, loss}} of the run's latest checkpoint (one
    schedule, SINGLE_MIXER, for a model without Oryx layers)."""
    experiment = apply_overrides(read_experiment(run_dir / "config.json"), overrides)
    types = sorted({spec.type for spec in experiment.model.layers})
    if not is_oryx(experiment.model) and len(types) > 1:
        raise ValueError(f"{run_dir}: a model without Oryx layers is evaluated as a single "
                         f"mixer (its attention fraction 1 or 0); expected one layer type, "
                         f"found {types}")
    ts, _ = restore_train_state(experiment, run_dir, make_mesh(experiment.train.mesh))
    data = bind_data(experiment.data, run_dir, resume=True)
    held_out, _ = held_out_set(data, experiment.train.batch_size, batches, experiment.train.seed)
    if not is_oryx(experiment.model):
        stats = evaluate(ts, held_out)
        attention = types == ["attention"]
        return {SINGLE_MIXER: {"recall": stats["accuracy"], "loss": stats["loss"],
                               "attention_fraction": float(attention)}}
    results = {}
    for name, schedule in SCHEDULES.items():
        stats = evaluate(ts, held_out, modes=schedule)
        results[name] = {"recall": stats["accuracy"], "loss": stats["loss"],
                         "attention_fraction": stats["attention_fraction"]}
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="JSON of every run's results")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    if args.batches < 0:  # no held-out batch: recall of nothing (0 is the whole held-out set)
        raise ValueError(f"--batches: expected 0 (all) or more, got {args.batches}")
    repeated = sorted({str(r) for r in args.run_dirs if args.run_dirs.count(r) > 1})
    if repeated:  # one key per run in --out: a repeat was evaluated twice for one entry
        raise ValueError(f"run directories: {repeated} given more than once")
    everything = {}
    print(f"{'run':28s} {'schedule':36s} {'recall':>7s} {'attention tokens':>17s}")
    for run_dir in args.run_dirs:
        results = run_modes(run_dir, args.batches, args.overrides)
        if not args.overrides:
            (run_dir / "modes.json").write_text(json.dumps(results, indent=1))
        everything[str(run_dir)] = results
        for name, row in results.items():
            print(f"{run_dir.name:28s} {name:36s} {row['recall']:7.3f} "
                  f"{100 * row['attention_fraction']:15.1f} %")
        if args.out is not None:  # after every run: a failing run keeps those before it
            args.out.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
