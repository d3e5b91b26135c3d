"""A model's initialisation on one GPU: compile time with the Threefry kernel
(`hybrid_jax.nn.init_random.fast_random_compile`, what `create_model` and the trainer use)
against XLA's fused lowering, and that both draw the same parameters.

    python -m experiments.benchmarks.init_compile [--check pha-tiny,gdn-tiny,transformer-tiny]
        [--models pha-180m,gdn-340m] [--fused-limit-s 60] [--out init_compile.json]

check   each `--check` preset initialised both ways: every parameter bit-identical
time    each `--models` preset, unscanned layers (the inference and `--no-scan` path): seconds to
        compile its initialisation with the kernel, then with the fused lowering in a child
        process stopped after `--fused-limit-s` (pha-180m's did not compile in 140 s)
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time

import jax
import numpy as np
from flax import nnx

from experiments.benchmarks.timing import device_name, print_table, write_json
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import presets
from hybrid_jax.nn.init_random import fast_random_compile
from hybrid_jax.nn.lm import LanguageModel


def _compiled_init(name: str, kernel: bool):
    config = presets.get(name).replace(scan_layers=False)

    def init():
        return nnx.split(LanguageModel(config, rngs=nnx.Rngs(0)))[1]

    start = time.perf_counter()
    with fast_random_compile() if kernel else contextlib.nullcontext():
        compiled = jax.jit(init).lower().compile()
    return compiled, time.perf_counter() - start


def check_row(name: str) -> dict:
    kernel, _ = _compiled_init(name, kernel=True)
    fused, _ = _compiled_init(name, kernel=False)
    a, b = jax.tree.leaves(kernel()), jax.tree.leaves(fused())
    same = len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(a, b, strict=True))
    return {"part": "check", "model": name, "arrays": len(a), "identical": same}


def time_row(name: str, limit: float) -> dict:
    row = {"part": "time", "model": name}
    row["kernel_compile_s"] = _compiled_init(name, kernel=True)[1]
    child = [sys.executable, "-m", __spec__.name, "--fused-child", name]
    try:
        out = subprocess.run(child, capture_output=True, text=True, timeout=limit, check=True)
        row["fused_compile_s"] = float(out.stdout.split()[-1])
    except subprocess.TimeoutExpired:
        row["fused_compile_s"] = f"> {limit:g}"
    except subprocess.CalledProcessError as e:
        # (a child killed by a signal may leave no stderr at all)
        row["error"] = (e.stderr.strip().splitlines() or [f"fused child exit {e.returncode}"]
                        )[-1][:160]
    print(row, flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--check", default="pha-tiny,gdn-tiny,transformer-tiny")
    parser.add_argument("--models", default="pha-180m,gdn-340m")
    parser.add_argument("--fused-limit-s", type=float, default=60)
    parser.add_argument("--fused-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="init_compile.json")
    args = parser.parse_args()
    if args.fused_child:
        print(_compiled_init(args.fused_child, kernel=False)[1])
        return
    print(device_name(), flush=True)
    rows = [check_row(name) for name in args.check.split(",") if name]
    rows += [time_row(name, args.fused_limit_s) for name in args.models.split(",") if name]
    print_table(rows, ["part", "model", "arrays", "identical", "kernel_compile_s",
                       "fused_compile_s", "error"])
    write_json(args.out, "init_compile", rows)


if __name__ == "__main__":
    run_with_logging(main)
