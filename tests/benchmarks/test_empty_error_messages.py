"""An exception with an empty message (a bare `assert` in a kernel's lowering, `MemoryError()`)
is reported in its row like any other: the error cell's own formatting must not raise (it took
the first line of the message, and an empty message has none: an IndexError that ended the
whole run, losing every row not yet written)."""

from __future__ import annotations

import argparse
import json
import sys

import jax.numpy as jnp


def _assertion(*args, **kwargs):
    raise AssertionError()


def test_measure_reports_an_empty_assertion_in_the_row():
    from experiments.benchmarks.timing import measure

    row = measure(lambda x: _assertion(), [jnp.ones(4)])
    assert row == {"error": "AssertionError: "}


def test_train_throughput_row_carries_an_empty_error(monkeypatch):
    import experiments.benchmarks.train_throughput as throughput

    monkeypatch.setattr(throughput, "build_step", _assertion)
    args = argparse.Namespace(scan=False, tokens=64, remat="none", conv=None, nha=None, data="",
                              oryx_modes="random_chunks", steps=1, peak=None, matmul_tflops=1.0)
    row = throughput.run_one("transformer-tiny", 32, args, packed=True)
    assert row["error"] == "AssertionError: "


def test_pha_efficiency_rows_carry_an_empty_error(monkeypatch):
    import experiments.benchmarks.pha_efficiency as pha

    row = {"part": "x"}
    assert pha._grad_row(row, lambda x: _assertion(), jnp.ones(4)) is None
    assert row["error"] == "AssertionError: "
    monkeypatch.setattr(pha, "create_model", _assertion)
    assert pha.inference_row("pha-tiny", 1, 4, 2)["error"] == "AssertionError: "


def test_long_context_probe_carries_an_empty_error():
    from experiments.benchmarks.long_context import Prober

    class Config:
        @property
        def vocab_size(self):
            raise AssertionError()

    prober = object.__new__(Prober)
    prober.name, prober.params, prober.config = "m", 1e6, Config()
    assert prober.probe(8, 60.0)["error"] == "AssertionError: "


def test_delta_rule_variant_row_carries_an_empty_error(monkeypatch):
    import experiments.benchmarks.delta_rule_kernel as bench

    monkeypatch.setattr(bench, "kernel_op", lambda blocks: lambda *a: _assertion())
    assert bench._time_variant(None, [jnp.ones(2)] * 5, "fwd") == {
        "error": "AssertionError: "}


def test_sharded_kernels_rung_carries_an_empty_error(monkeypatch, tmp_path):
    import experiments.benchmarks.sharded_kernels as bench

    monkeypatch.setattr(bench, "run_case", _assertion)
    out = tmp_path / "s.json"
    monkeypatch.setattr(sys, "argv", ["sharded_kernels", "--rungs", "ssd", "--out", str(out)])
    bench.main()
    assert json.loads(out.read_text())["rows"] == [{"rung": "ssd", "error": "AssertionError: "}]


def test_linear_ops_rungs_name_an_empty_refusal(monkeypatch):
    import experiments.benchmarks.linear_ops as bench

    def op(*args, implementation):
        raise ValueError()

    monkeypatch.setitem(bench.OPS, "ssd", op)
    found = bench.rungs("ssd", (jnp.ones(2),))
    assert found and all(reason == "" for _, reason in found)
