"""`experiments/benchmarks/flash_attention.py`'s sweep with `--rounds`: every variant that
compiled is timed once per round, the rounds in turns over all of them, and keeps the median
(the kernels and the timer stand-ins: the sweep's bookkeeping alone)."""

from __future__ import annotations

import argparse
import itertools

import jax.numpy as jnp

from experiments.benchmarks import flash_attention as bench


def test_sweep_rounds_take_turns_and_keep_each_variants_median(monkeypatch):
    counter, batched = itertools.count(), []

    def time_compiled(fn, *args, calls=1):
        batched.append(calls)
        return float(next(counter))

    monkeypatch.setattr(bench, "time_compiled", time_compiled)
    kernel = lambda blocks, x: x * 2.0
    monkeypatch.setattr(bench, "_sweep_kernels", lambda q, *rest: {
        name: (kernel, (jnp.ones(3),)) for name in ("forward", "dq", "dkv")})
    one_forward = (64, 32, 4, 4, False, False)  # not the D 64 default
    monkeypatch.setitem(bench.SWEEP_VARIANTS, 64,
                        {"forward": [one_forward], "dq": [], "dkv": []})
    args = argparse.Namespace(shapes=["tiny"], documents="packed", doc_median=100.0,
                              sweep_seconds=600.0, rounds=3)
    out = bench.part_sweep(args)
    timed = [row for row in out["variants"] if "ms" in row]
    # First pass: the defaults' forward, dq, dk/dv, then the variant (calls 0-3); rounds two
    # and three in the same order (4-7, 8-11): the medians are the second round's.
    assert [row["kernel"] for row in timed] == ["forward", "dq", "dkv", "forward"]
    assert [row["ms_rounds"] for row in timed] == [[0.0, 4.0, 8.0], [1.0, 5.0, 9.0],
                                                   [2.0, 6.0, 10.0], [3.0, 7.0, 11.0]]
    assert [row["ms"] for row in timed] == [4.0, 5.0, 6.0, 7.0]
    assert all(row["max_rel_diff"] < 2e-2 for row in timed)
    assert batched == [bench.CALLS] * 12  # back-to-back calls per time, as the tables take
    ms = out["best"]["tiny"]["ms"]
    assert ms["forward"] == 4.0 and ms["default"] == {"forward": 4.0, "dq": 5.0, "dkv": 6.0}
