"""DeepNorm vs pre-norm / post-norm residuals in a deep, narrow stack (PHA issue, item 5).

    python -m experiments.deepnorm_stability --out runs/stability [--steps 150] [--layers 48]
        [--learning-rate 5e-3] [--data ../shared/data]

Trains the same 48-layer byte-level model on WikiText-2 three times, changing only the residual
scheme of its blocks (attention → SwiGLU, `layer("sequential", residual=...)`), with no
learning-rate warm-up and no gradient clipping, at a learning rate a shallow model trains well
with. Writes each run under `OUT/<residual>/`, the curves to `OUT/stability.png` and a table to
`OUT/stability.json` (final train loss, eval loss, steps before a non-finite loss).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from experiments.configs.lm import DATA, WIKITEXT2_RAW
from hybrid_jax.config import ExperimentConfig, ModelConfig, TrainConfig, layer
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.plot import plot_runs
from hybrid_jax.train.trainer import NonFiniteLossError, train

RESIDUALS = ("deepnorm", "pre_norm", "post_norm")


def experiment(residual: str, *, layers: int, steps: int, learning_rate: float,
               data_dir: str = DATA) -> ExperimentConfig:
    block = layer("sequential", branches=("attention", "ffn"), residual=residual)
    model = ModelConfig(layers=(block,) * layers, vocab_size=257, d_model=32, num_heads=2,
                        ffn_dim=64)
    train_config = TrainConfig(steps=steps, batch_size=16, learning_rate=learning_rate,
                               warmup_steps=0, min_lr_ratio=1.0, grad_clip=0.0, log_every=5,
                               eval_batches=4, checkpoint_every=0)
    return ExperimentConfig(name=f"deepnorm-stability-{residual}", model=model,
                            data=replace(WIKITEXT2_RAW, seq_len=64,
                                         path=f"{data_dir}/wikitext-2-raw/wiki.train.raw",
                                         eval_path=f"{data_dir}/wikitext-2-raw/wiki.valid.raw"),
                            train=train_config)


def run(out: Path, *, layers: int, steps: int, learning_rate: float, data_dir: str = DATA
        ) -> dict:
    table = {}
    for residual in RESIDUALS:
        run_dir = out / residual
        try:
            config = experiment(residual, layers=layers, steps=steps,
                                learning_rate=learning_rate, data_dir=data_dir)
            result = train(config, run_dir, progress=False)
            diverged = None
        except NonFiniteLossError as error:
            result, diverged = {}, error.step
        losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
        table[residual] = {"final_train_loss": losses[-1] if losses else math.nan,
                           "eval_loss": result.get("eval_loss"), "diverged_at_step": diverged,
                           "first_train_loss": losses[0] if losses else math.nan}
        print(residual, table[residual], flush=True)
    summary = {"layers": layers, "steps": steps, "learning_rate": learning_rate,
               "warmup_steps": 0, "grad_clip": 0.0, "results": table}
    (out / "stability.json").write_text(json.dumps(summary, indent=2))
    plot_runs([out / r for r in RESIDUALS], out / "stability.png", log_y=True)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--data", default=DATA, help="folder holding wikitext-2-raw/")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.out, layers=args.layers, steps=args.steps, learning_rate=args.learning_rate,
        data_dir=args.data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
