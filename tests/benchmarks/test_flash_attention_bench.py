"""`experiments/benchmarks/flash_attention.py`'s sweep with `--rounds`: every variant that
compiled is timed once per round, the rounds in turns over all of them, and keeps the median
(the kernels and the timer stand-ins: the sweep's bookkeeping alone); a variant whose result
differs is refused; the atomic backward's pick; the table rows' useful FLOPs by hand."""

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


def test_useful_flops_by_hand():
    """4·D·H FLOPs a visible (query, key) pair: causal T 4 sees 1+2+3+4 keys, a window of 2
    1+2+2+2, documents [0, 0, 1, 1, 1] 1+2+1+2+3."""
    assert bench._useful_flops(8, 1, 4, None, None) == 4 * 8 * 10
    assert bench._useful_flops(8, 2, 4, None, 2) == 4 * 8 * 2 * 7
    assert bench.useful_pairs(jnp.array([[0, 0, 1, 1, 1]]), 1, 5, None) == 9


def test_table_rows_count_the_flops_of_their_own_masks(monkeypatch):
    """The "tiny" shape (B 1, T 256, H 2 over 1 kv head, D 64, window 64): each row's FLOPs
    are 4 · D · H per pair its mask lets through, counted here by a loop over positions."""
    import numpy as np

    seen = []

    def measure(op, x, flops):
        seen.append(flops)
        return {}

    monkeypatch.setattr(bench, "measure", measure)
    args = argparse.Namespace(shapes=["tiny"], doc_median=100.0, skip=["f16"])
    rows = bench.part_table(args)
    ids = bench.packed_segments(1, 256, 100.0)[0]
    starts = [next(s for s in range(t + 1) if ids[s] == ids[t]) for t in range(256)]
    pairs = {"causal": sum(t + 1 for t in range(256)),
             "swa": sum(min(t + 1, 64) for t in range(256)),
             "packed": sum(t - starts[t] + 1 for t in range(256)),
             "packed swa": sum(min(t - starts[t] + 1, 64) for t in range(256))}
    want = {"cudnn causal": ("causal", None), "cudnn swa": ("swa", 64),
            "pallas causal": ("causal", None), "pallas packed": ("packed", None),
            "pallas packed swa": ("packed swa", 64), "xla packed": ("packed", None)}
    assert [row["impl"] for row in rows] == list(want)
    for i, row in enumerate(rows):
        mask, window = want[row["impl"]]
        assert seen[i] == 4 * 64 * 2 * pairs[mask] and row["w"] == window, row["impl"]
    assert np.unique(ids).size > 2  # documents do cut the rows


def _fake_sweep(monkeypatch, times, kernel):
    """`part_sweep` at the "tiny" shape over the D 64 default and one forward variant (block_k
    32), `kernel(blocks, x)` standing in for the kernels and `times` for the timer."""
    monkeypatch.setattr(bench, "time_compiled", lambda fn, *args, calls=1: next(times))
    monkeypatch.setattr(bench, "_sweep_kernels", lambda q, *rest: {
        name: (kernel, (jnp.ones(3),)) for name in ("forward", "dq", "dkv")})
    monkeypatch.setitem(bench.SWEEP_VARIANTS, 64, {"forward": [(64, 32, 4, 4, False, False)],
                                                   "dq": [], "dkv": []})
    args = argparse.Namespace(shapes=["tiny"], documents="packed", doc_median=100.0,
                              sweep_seconds=600.0, rounds=3)
    return bench.part_sweep(args)


def test_sweep_keeps_the_median_not_the_mean(monkeypatch):
    # rounds in turns over forward, dq, dk/dv, the variant: the variant's times 1, 1, 10
    # (median 1, mean 4) against the default forward's 2, 2, 2
    times = iter([2.0, 5.0, 5.0, 1.0, 2.0, 5.0, 5.0, 1.0, 2.0, 5.0, 5.0, 10.0])
    out = _fake_sweep(monkeypatch, times, lambda blocks, x: x * 2.0)
    variant = [row for row in out["variants"] if "ms" in row][3]
    assert variant["ms_rounds"] == [1.0, 1.0, 10.0] and variant["ms"] == 1.0
    assert out["best"]["tiny"]["blocks"]["block_k"] == 32
    assert out["best"]["tiny"]["ms"]["forward"] == 1.0


def test_sweep_refuses_a_faster_variant_whose_result_differs(monkeypatch):
    times = iter([2.0, 5.0, 5.0, 1.0] * 3)
    out = _fake_sweep(monkeypatch, times,
                      lambda blocks, x: x * (3.0 if blocks.block_k == 32 else 2.0))
    variant = out["variants"][3]
    assert variant["error"] == "differs from the default blocks" and "ms" not in variant
    assert "block_k" not in out["best"]["tiny"]["blocks"]  # the default's forward
    assert out["best"]["tiny"]["ms"]["forward"] == 2.0


def test_assemble_picks_the_atomic_backward_only_when_it_beats_dq_plus_dkv():
    import dataclasses

    from pallas_kernels.flash_attention.block_sizes import default_block_sizes

    base = dataclasses.replace(default_block_sizes(64), dq_atomic=False)
    atomic = dataclasses.replace(base, dq_atomic=True)
    times = {("forward", base): 1.0, ("dq", base): 2.0, ("dkv", base): 3.0}
    blocks, parts = bench._assemble(base, {**times, ("dkv", atomic): 4.0})  # 4 < 2 + 3
    assert blocks.dq_atomic and (parts["dq"], parts["dkv"]) == (None, 4.0)
    blocks, parts = bench._assemble(base, {**times, ("dkv", atomic): 5.5})
    assert not blocks.dq_atomic and (parts["dq"], parts["dkv"]) == (2.0, 3.0)
    assert parts["default"] == {"forward": 1.0, "dq": 2.0, "dkv": 3.0}
