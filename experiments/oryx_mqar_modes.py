"""Oryx on MQAR: recall of a trained run under several per-token mode schedules.

    python -m experiments.oryx_mqar_modes RUN_DIR [--batches N]

Schedules: all linear, all attention, and linear everywhere except the query tokens (the
positions whose next token is scored: attention there only, i.e. linear prefill of the
key-value context and attention where the answer is read). Prints recall (accuracy on the
scored positions) and the fraction of tokens in attention mode, and writes `modes.json` in
the run directory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.run import read_experiment
from hybrid_jax.context import EXTRA_PREFIX
from hybrid_jax.nn.oryx import MODE
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import bind_data, evaluate, held_out_set, restore_train_state

SCHEDULES = {
    "linear": lambda batch: np.zeros_like(batch["mask"], np.int32),
    "attention": lambda batch: np.ones_like(batch["mask"], np.int32),
    "linear + attention on queries": lambda batch: batch["mask"].astype(np.int32),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args(argv)
    experiment = read_experiment(args.run_dir / "config.json")
    ts, _ = restore_train_state(experiment, args.run_dir, make_mesh(experiment.train.mesh))
    data = bind_data(experiment.data, args.run_dir, resume=True)
    batches, _ = held_out_set(data, experiment.train.batch_size, args.batches,
                              experiment.train.seed)
    results = {}
    for name, schedule in SCHEDULES.items():
        with_modes = [{**b, f"{EXTRA_PREFIX}{MODE}": schedule(b)} for b in batches]
        stats = evaluate(ts, with_modes)
        fraction = float(np.mean([schedule(b).mean() for b in batches]))
        results[name] = {"recall": stats["accuracy"], "attention_fraction": fraction}
        print(f"{name:32s} recall {stats['accuracy']:.3f}   attention tokens "
              f"{100 * fraction:5.1f} %")
    (args.run_dir / "modes.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
