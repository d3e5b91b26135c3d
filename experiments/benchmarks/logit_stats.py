"""The loss's per-row logit statistics: the Pallas kernel (one read of the float32 logits)
against the XLA rung (the argmax's reduction, then Σ exp: two reads).

    python -m experiments.benchmarks.logit_stats [--parts check,table] [--rows 32768]
        [--vocab 32000,32768] [--variants LABELS] [--interpret] [--out logit_stats.json]

float32 logits `[rows, V]` (the LM head's output: 16 × 2048 tokens of transformer-125m, or
4 × 8192 of the 340M models; V 32768 and 32000). Parts, in order:
  check  the kernel against the XLA rung on N(0, 3²) logits with ties, NaN, ±∞ and −∞-only
         rows and out-of-range targets written in: best, top and target_logit equal, sum_exp
         within 1e-5 relative (0, ∞ and NaN sums equal)
  table  ms a call of both rungs, the byte floor (the logits read once at 4.3 TB/s) and the
         kernel's ratio to it; `--variants` adds kernel rows at other tiles (`VARIANTS`)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import (
    CALLS,
    HBM_TB_S,
    device_name,
    parse_labels,
    print_table,
    run_parts,
    time_compiled,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.ops.logit_stats import logit_stats_xla
from pallas_kernels.logit_stats import api
from pallas_kernels.logit_stats.block_sizes import BlockSizes

VARIANTS = {
    "1024 columns": dict(block_vocab=1024),
    "2048 columns": dict(block_vocab=2048),
    "4096 columns 8 warps": dict(block_vocab=4096, num_warps=8),
    "2 rows": dict(block_rows=2),
    "4 rows 8 warps": dict(block_rows=4, num_warps=8),
    "2 warps": dict(num_warps=2),
    "8 warps": dict(num_warps=8),
    "prefetch": dict(prefetch=True),
    "2048 columns prefetch": dict(block_vocab=2048, prefetch=True),
    "2048 columns 8 warps": dict(block_vocab=2048, num_warps=8),
}


def inputs(rows: int, vocab: int, special: bool):
    keys = jax.random.split(jax.random.key(0))
    logits = 3 * jax.random.normal(keys[0], (rows, vocab), jnp.float32)
    targets = jax.random.randint(keys[1], (rows,), 0, vocab)
    if special:
        logits = logits.at[0, jnp.array([3, vocab - 3])].set(9.0)  # a tie across tiles
        logits = logits.at[1, jnp.array([5, vocab - 1])].set(jnp.array([jnp.nan, jnp.nan]))
        logits = logits.at[2, 7].set(jnp.inf).at[3].set(-jnp.inf)
        targets = targets.at[jnp.array([4, 5])].set(jnp.array([-1, vocab]))
    return logits, targets


def check(args) -> list[dict]:
    rows = []
    for vocab in args.vocab:
        logits, targets = inputs(args.rows, vocab, special=True)
        got = jax.jit(functools.partial(api.logit_stats, interpret=args.interpret))(
            logits, targets)
        want = jax.jit(logit_stats_xla)(logits, targets)
        same = lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
        got_sum, want_sum = np.asarray(got.sum_exp), np.asarray(want.sum_exp)
        positive = np.isfinite(want_sum) & (want_sum > 0)  # the others (0, ∞, NaN) exactly
        row = dict(rows=args.rows, vocab=vocab, best=same(got.best, want.best),
                   top=same(got.top, want.top), target=same(got.target_logit,
                                                            want.target_logit),
                   exact_sums=same(got_sum[~positive], want_sum[~positive]),
                   sum_exp_rel=float(np.max(np.abs(got_sum[positive] / want_sum[positive]
                                                   - 1))))
        row["pass"] = (row["best"] and row["top"] and row["target"] and row["exact_sums"]
                       and row["sum_exp_rel"] < 1e-5)
        rows.append(row)
    print_table(rows, list(rows[0]))
    print("check:", "PASS" if all(r["pass"] for r in rows) else "FAIL", flush=True)
    return rows


def table(args) -> list[dict]:
    labels = parse_labels(args.variants, list(VARIANTS))
    rows = []
    for vocab in args.vocab:
        logits, targets = inputs(args.rows, vocab, special=False)
        floor = logits.size * 4 / (HBM_TB_S * 1e9)
        runs = [("xla", jax.jit(logit_stats_xla))]
        runs += [(f"pallas{', ' + label if label else ''}",
                  jax.jit(functools.partial(api.logit_stats, interpret=args.interpret,
                                            block_sizes=BlockSizes(**VARIANTS.get(label, {})))))
                 for label in ["", *labels]]
        for name, fn in runs:
            ms = time_compiled(fn, logits, targets, calls=CALLS)
            rows.append(dict(rows=args.rows, vocab=vocab, rung=name, ms=round(ms, 4),
                             floor_ms=round(floor, 4), x_floor=round(ms / floor, 2),
                             tb_s=round(logits.size * 4 / ms / 1e9, 2)))
            print_table(rows[-1:], list(rows[-1]))
    print_table(rows, list(rows[0]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--parts", default="check,table")
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--vocab", type=lambda s: [int(v) for v in s.split(",")],
                        default=[32768, 32000])
    parser.add_argument("--variants", default="none")
    parser.add_argument("--interpret", action="store_true", help="kernels in interpret mode "
                        "(a CPU smoke run)")
    parser.add_argument("--out", default="logit_stats.json")
    args = parser.parse_args()
    print(device_name(), flush=True)
    run_parts(dict(check=check, table=table), args.parts, args, args.out, "logit_stats",
              device=device_name(), defaults=dataclasses.asdict(BlockSizes()))


if __name__ == "__main__":
    run_with_logging(main)
