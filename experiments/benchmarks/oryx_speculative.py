"""Oryx self-speculative decoding against attention-mode decoding: tokens/s and acceptance.

    python -m experiments.benchmarks.oryx_speculative RUN_DIR [--k 2,4,8] [--batch 1,4]
        [--prompt-len 64] [--new-tokens 128] [--out results.json]
    python -m experiments.benchmarks.oryx_speculative --train EXPERIMENT --steps N
        --out-dir DIR [--set key=value ...] [...]        (train first, then measure)
    python -m experiments.benchmarks.oryx_speculative --presets oryx-gdn-130m,... [...]
                                                     (random weights, random prompts)

Prompts of a run are the first `--prompt-len` tokens of held-out rows of its data; a preset
(`--presets`, with or without a run) gets random weights and random prompt ids, so its rows
time a round, not a trained model's acceptance (the drafts of an untrained model rarely match
its attention mode). For each model and batch size: greedy attention-mode decoding
(`modes="attention"`, the reference) and speculative decoding with each k (`speculative=k`);
every configuration is run once to compile, then timed as the fastest of 3 calls. Prints a
table (tokens/s, speed-up, acceptance rate, tokens per round, identical to the reference) and
writes JSON. `--budget-s`: configurations that would start after this many seconds (counted
from the start, training included) are left out, and the table says which.

GPU (one H200, one command ≤ 4 min, the lead's wheel prefix first): `bash
experiments/benchmarks/results/oryx1/run.sh` (WikiText-2 raw in .devdata/: `cp
../shared/data/wikitext-2-raw/wiki.{train,valid}.raw .devdata/`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from experiments.benchmarks.timing import print_table, write_json
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from experiments.run import read_experiment, run_experiment
from hybrid_jax import presets
from hybrid_jax.generate import generate
from hybrid_jax.nn.lm import create_model
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


def run_model(run_dir: Path):
    """(name, model, prompts(batch, length) -> [batch, length] int32) of a trained run."""
    experiment = read_experiment(run_dir / "config.json")
    ts, _ = restore_train_state(experiment, run_dir, make_mesh(experiment.train.mesh))
    data = bind_data(experiment.data, run_dir, resume=True)

    def prompts(batch, length):
        held_out, _ = held_out_set(data, batch, 1, experiment.train.seed)
        return held_out[0]["inputs"][:, :length].astype(np.int32)

    return run_dir.name, ts.model(), prompts


def preset_model(name: str, dtype: str | None = None):
    """(name, model, prompts) of a preset (compute `dtype`, default its own) with random
    weights and random prompt ids."""
    config = presets.get(name)
    config = config if dtype is None else config.replace(dtype=dtype)

    def prompts(batch, length):
        return np.random.default_rng(0).integers(0, config.vocab_size, (batch, length),
                                                 dtype=np.int32)

    return f"{name} (random)", create_model(config), prompts


def measure(name: str, model, prompts, ks: list[int], batches: list[int], prompt_len: int,
            new_tokens: int, deadline: float) -> list[dict]:
    """The rows of one model; configurations that would start past `deadline`
    (`time.perf_counter()`) are rows saying so."""
    rows = []
    for batch in batches:
        prompt = prompts(batch, prompt_len)
        want = base = None
        for k in [0, *ks]:
            row = {"model": name, "batch": batch, "decoding": "speculative" if k else "attention",
                   "k": k}
            if time.perf_counter() > deadline or (k and want is None):
                rows.append({**row, "skipped": "time budget"})
                continue
            stats = {}
            got, seconds = timed_generate(model, prompt, new_tokens,
                                          **(dict(speculative=k, stats=stats) if k else
                                             dict(modes="attention")))
            rate = batch * new_tokens / seconds
            want, base = (got, rate) if not k else (want, base)
            rows.append({**row, "tokens_per_s": rate, "speedup": rate / base,
                         "acceptance": stats.get("acceptance_rate"),
                         "tokens_per_round": stats.get("tokens_per_round", 1.0),
                         "identical": bool((got == want).all())})
            print(f"{name} batch {batch} k {k}: {rate:.1f} tokens/s", flush=True)
    return rows


def parse_counts(text: str, flag: str) -> list[int]:
    """"2,4,8" → [2, 4, 8]: distinct integers >= 1. A k of 0 was a second attention row (and
    the new reference of the rows after it), a repeat a second row of one setting."""
    try:
        counts = [int(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}: expected integers >= 1 separated by commas, got {text!r}"
                         ) from None
    bad = [n for n in counts if n < 1]
    repeated = sorted({n for n in counts if counts.count(n) > 1})
    if bad or repeated:
        raise ValueError(f"{flag}: expected distinct integers >= 1, got {text!r}")
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
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
    parser.add_argument("--presets", default=None, metavar="NAME,...",
                        help="also presets with random weights (after the run)")
    parser.add_argument("--presets-k", default=None, help="the presets' k (default --k)")
    parser.add_argument("--presets-batch", default=None,
                        help="the presets' batch sizes (default --batch)")
    parser.add_argument("--dtype", default=None, help="the presets' compute dtype")
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    # Parsed before anything trains or loads, so a typo costs no training run.
    settings = [(parse_counts(args.k, "--k"), parse_counts(args.batch, "--batch")),
                (parse_counts(args.presets_k or args.k, "--presets-k"),
                 parse_counts(args.presets_batch or args.batch, "--presets-batch"))]
    if args.budget_s is not None and args.budget_s < 0:
        raise ValueError(f"--budget-s: expected seconds >= 0, got {args.budget_s:g}")
    # `budget_s or inf` took a budget of 0 for none: every configuration timed.
    deadline = time.perf_counter() + (float("inf") if args.budget_s is None else args.budget_s)
    run_dir = args.run_dir
    if args.train is not None:
        if args.out_dir is None:
            parser.error("--train needs --out-dir")
        overrides = args.overrides + ([f"train.steps={args.steps}"] if args.steps else [])
        start = time.perf_counter()
        run_experiment(args.train, out_dir=args.out_dir, overrides=overrides, force=True)
        print(f"trained {args.train} in {time.perf_counter() - start:.0f} s")
        run_dir = args.out_dir
    if run_dir is None and args.presets is None:
        parser.error("give RUN_DIR, --train or --presets")
    names = [name for name in (args.presets or "").split(",") if name]
    sources = ([(lambda: run_model(run_dir), *settings[0])] if run_dir is not None
               else []) + [((lambda name=name: preset_model(name, args.dtype)), *settings[1])
                           for name in names]
    rows = []
    for source, ks, batches in sources:
        rows += measure(*source(), ks, batches, args.prompt_len, args.new_tokens, deadline)
        if args.out is not None:  # after each model: a run cut short keeps what it measured
            write_json(args.out, "oryx_speculative", rows, run_dir=str(run_dir),
                       prompt_len=args.prompt_len, new_tokens=args.new_tokens, quiet=True)
    print_table(rows, ["model", "batch", "decoding", "k", "tokens_per_s", "speedup",
                       "acceptance", "tokens_per_round", "identical", "skipped"])
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
