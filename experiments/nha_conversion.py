"""lm-gutenberg-nha-conversion: how much perplexity a pretrained transformer converted to NHA
recovers with a short fine-tune, at windows 64 and 512, against the original at full attention.

    python -m experiments.nha_conversion HF_DIR --out runs/nha-conversion \\
        [--windows 64,512] [--slots 64] [--no-freeze-mlp] [--set train.steps=1000 ...]

Steps (every one a `hybrid-jax` command's function, so each run directory can be inspected,
evaluated or resumed on its own): import HF_DIR (a small Llama/Qwen2 in Hugging Face layout) →
OUT/original; evaluate it on Gutenberg at full attention; for each window W convert it to NHA
(OUT/nha-wW), evaluate it before fine-tuning, fine-tune it on Gutenberg (`FINETUNE`, MLPs
frozen unless --no-freeze-mlp) and evaluate it again. Writes OUT/results.json and prints a
table. Sized for one GPU (bf16, seq_len 1024); NOT RUN YET: no results are recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.configs.lm import GUTENBERG

NAME = "lm-gutenberg-nha-conversion"
# The fine-tune: a short schedule at a small learning rate on Gutenberg, MLPs frozen.
FINETUNE = (f"data.path={GUTENBERG.path.replace('train-00', 'train-*')}",
            f"data.eval_path={GUTENBERG.eval_path}", "data.seq_len=1024",
            "train.steps=1000", "train.batch_size=16", "train.learning_rate=1e-4",
            "train.warmup_steps=50", "train.eval_batches=32", "train.checkpoint_every=500")
FROZEN_MLP = "train.freeze=/ffn/"


def _evaluate(run_dir: Path, overrides: Sequence[str], batches: int) -> dict[str, float]:
    from experiments.cli import _load_run, _read_run
    from hybrid_jax.train.trainer import bind_data, evaluate, held_out_set

    experiment = _read_run(run_dir, overrides)
    ts, _ = _load_run(run_dir, experiment, None, "eval")
    data = bind_data(experiment.data, run_dir, resume=True)
    held_out, words = held_out_set(data, experiment.train.batch_size, batches,
                                   experiment.train.seed)
    return evaluate(ts, held_out, num_words=words)


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.run import run_experiment
    from hybrid_jax.convert.hf import import_hf
    from hybrid_jax.convert.nha import convert_run

    parser = argparse.ArgumentParser(prog="python -m experiments.nha_conversion",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs") / NAME)
    parser.add_argument("--windows", default="64,512")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-freeze-mlp", action="store_true")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    overrides = [*FINETUNE, *([] if args.no_freeze_mlp else [FROZEN_MLP]), *args.overrides]
    eval_batches = int(next(o for o in reversed(overrides)
                            if o.startswith("train.eval_batches=")).split("=")[1])
    experiment, model = import_hf(args.hf_dir, args.out / "original", dtype=args.dtype)
    results = {"original": _evaluate(args.out / "original", overrides, eval_batches)}
    for window in (int(w) for w in args.windows.split(",")):
        run_dir = args.out / f"nha-w{window}"
        convert_run(experiment, model, args.out / "original", run_dir, window=window,
                    num_slots=args.slots)
        before = _evaluate(run_dir, overrides, eval_batches)
        run_experiment(f"{experiment.name}-nha", out_dir=run_dir, overrides=overrides,
                       resume=True)
        results[f"nha-w{window}"] = {"before_finetune": before,
                                     "after_finetune": _evaluate(run_dir, overrides,
                                                                 eval_batches)}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"{'model':14s} {'ppl before':>12s} {'ppl after':>12s}")
    print(f"{'original':14s} {results['original']['perplexity']:12.3f}")
    for key, value in results.items():
        if key != "original":
            print(f"{key:14s} {value['before_finetune']['perplexity']:12.3f} "
                  f"{value['after_finetune']['perplexity']:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
