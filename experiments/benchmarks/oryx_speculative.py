"""Oryx self-speculative decoding against attention-mode decoding: tokens/s and acceptance.

    python -m experiments.benchmarks.oryx_speculative RUN_DIR [--k 2,4,8] [--batch 1,4]
        [--prompt-len 64] [--new-tokens 128] [--out results.json]
    python -m experiments.benchmarks.oryx_speculative --train EXPERIMENT --steps N
        --out-dir DIR [--set key=value ...] [...]        (train first, then measure)

Prompts are the first `--prompt-len` tokens of held-out rows of the run's data. For each batch
size: greedy attention-mode decoding (`modes="attention"`, the reference) and speculative
decoding with each k (`speculative=k`); every configuration is run once to compile, then
timed as the fastest of 3 calls. Prints a table (tokens/s, speed-up, acceptance rate, tokens
per round, identical to the reference) and writes JSON.

GPU (one H200, ≤ 3 min; the WikiText-2 files copied to .devdata/ first, `cp
/work/shared/data/wikitext-2-raw/wiki.{train,valid}.raw .devdata/`):

    python -m experiments.benchmarks.oryx_speculative --train lm-wikitext2-oryx-gdn-small \\
        --steps 400 --out-dir /tmp/oryx-small --set data.path=.devdata/wiki.train.raw \\
        --set data.eval_path=.devdata/wiki.valid.raw --k 2,4,8 --batch 1,8 \\
        --new-tokens 256 --out experiments/benchmarks/results/oryx_speculative_h200.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from experiments.benchmarks.timing import print_table, write_json
from experiments.run import read_experiment, run_experiment
from hybrid_jax.generate import generate
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import bind_data, held_out_set, restore_train_state


def timed_generate(*args, repeats: int = 3, **kwargs):
    """`generate(*args, **kwargs)` once to compile, then the fastest of `repeats` timed calls:
    (tokens, seconds)."""
    out = np.asarray(generate(*args, **kwargs))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = np.asarray(generate(*args, **kwargs))
        best = min(best, time.perf_counter() - start)
    return out, best


def measure(run_dir: Path, ks: list[int], batches: list[int], prompt_len: int,
            new_tokens: int) -> list[dict]:
    experiment = read_experiment(run_dir / "config.json")
    ts, _ = restore_train_state(experiment, run_dir, make_mesh(experiment.train.mesh))
    model = ts.model()
    data = bind_data(experiment.data, run_dir, resume=True)
    rows = []
    for batch in batches:
        held_out, _ = held_out_set(data, batch, 1, experiment.train.seed)
        prompt = held_out[0]["inputs"][:, :prompt_len].astype(np.int32)
        want, seconds = timed_generate(model, prompt, new_tokens, modes="attention")
        base = batch * new_tokens / seconds
        rows.append({"batch": batch, "decoding": "attention", "k": 0, "tokens_per_s": base,
                     "speedup": 1.0, "acceptance": None, "tokens_per_round": 1.0,
                     "identical": True})
        for k in ks:
            stats = {}
            got, seconds = timed_generate(model, prompt, new_tokens, speculative=k, stats=stats)
            rate = batch * new_tokens / seconds
            rows.append({"batch": batch, "decoding": "speculative", "k": k,
                         "tokens_per_s": rate, "speedup": rate / base,
                         "acceptance": stats["acceptance_rate"],
                         "tokens_per_round": stats["tokens_per_round"],
                         "identical": bool((got == want).all())})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?", default=None)
    parser.add_argument("--train", default=None, metavar="EXPERIMENT",
                        help="train this experiment into --out-dir first")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--k", default="2,4,8")
    parser.add_argument("--batch", default="1,4")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    run_dir = args.run_dir
    if args.train is not None:
        if args.out_dir is None:
            parser.error("--train needs --out-dir")
        overrides = args.overrides + ([f"train.steps={args.steps}"] if args.steps else [])
        start = time.perf_counter()
        run_experiment(args.train, out_dir=args.out_dir, overrides=overrides, force=True)
        print(f"trained {args.train} in {time.perf_counter() - start:.0f} s")
        run_dir = args.out_dir
    if run_dir is None:
        parser.error("give RUN_DIR or --train")
    rows = measure(run_dir, [int(k) for k in args.k.split(",")],
                   [int(b) for b in args.batch.split(",")], args.prompt_len, args.new_tokens)
    print_table(rows, ["batch", "decoding", "k", "tokens_per_s", "speedup", "acceptance",
                       "tokens_per_round", "identical"])
    if args.out is not None:
        write_json(args.out, "oryx_speculative", rows, run_dir=str(run_dir),
                   prompt_len=args.prompt_len, new_tokens=args.new_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
