"""The numbers `experiments/benchmarks/timing.py` puts in the tables, pinned by hand: the median
of the timed repeats (warm-up outside them, per call), TFLOP/s and the fwd / fwd+bwd columns of
`measure`, the Markdown of BENCHMARKS.md, the JSON record, the parts' order, relative error."""

from __future__ import annotations

import json
import platform
import types

import jax
import jax.numpy as jnp
import pytest

from experiments.benchmarks import timing
from tests.helpers import FakeClock


def test_time_compiled_is_the_median_ms_per_call_after_the_warm_up(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    monkeypatch.setattr(timing, "WARMUP_S", 1.0)
    # Two warm-up calls of 5 s, then 3 repeats of 2 calls of 0.25, 0.5 and 2 s each.
    durations = iter([5.0, 5.0, 0.25, 0.25, 0.5, 0.5, 2.0, 2.0])
    out = jnp.zeros(())

    def op():
        clock.now += next(durations)
        return out

    assert timing.time_compiled(op, warmup=2, iters=3, calls=2) == 500.0  # ms: 250, 500, 2000
    assert next(durations, None) is None  # no call more, none fewer


def test_measure_puts_each_time_and_its_tflops_in_its_column(monkeypatch):
    """The fwd+bwd time is of the gradient (2 inputs: a tuple of 2), the forward's of the
    output; TFLOP/s = FLOPs / ms / 1e9, fwd+bwd counted as 3.5 × the forward's FLOPs; each
    time of `CALLS` back-to-back calls; temp memory of the fwd+bwd."""
    seen = []

    def time_compiled(fn, *args, calls=1):
        seen.append(calls)
        out = fn(*args)
        return 4.0 if isinstance(out, tuple) and len(out) == 2 else 1.0

    monkeypatch.setattr(timing, "time_compiled", time_compiled)
    op = lambda a, b: jnp.tanh(a @ b)  # noqa: E731
    a = jnp.ones((64, 64))
    row = timing.measure(op, [a, a], flops=3e9)
    assert seen == [timing.CALLS, timing.CALLS]
    assert (row["fwd_ms"], row["fwd_bwd_ms"]) == (1.0, 4.0)
    assert row["fwd_TFLOPs"] == 3e9 / 1.0 / 1e9
    assert row["fwd_bwd_TFLOPs"] == 3.5 * 3e9 / 4.0 / 1e9
    loss = lambda a, b: jnp.sum(op(a, b))  # noqa: E731
    bwd_bytes = timing.temp_bytes(jax.jit(jax.grad(loss, argnums=(0, 1))), a, a)
    assert bwd_bytes > 0 and row["temp_MiB"] == bwd_bytes / 2**20


def test_forward_and_backward_differentiates_every_input():
    fwd, bwd = timing.forward_and_backward(lambda a, b: a * b, 2)
    a, b = jnp.array([1.0, 2.0]), jnp.array([3.0, 5.0])
    da, db = bwd(a, b)
    assert da.tolist() == [3.0, 5.0] and db.tolist() == [1.0, 2.0]
    assert fwd(a, b).tolist() == [3.0, 10.0]


def test_markdown_table_by_hand():
    rows = [{"op": "ssd", "fwd_ms": 0.12345, "tokens": 1234.4, "n": 7},
            {"op": "gdn", "error": "OOM"}]
    assert timing.markdown_table(rows, ["op", "fwd_ms", "tokens", "n", "error"]) == (
        "| op | fwd_ms | tokens | n | error |\n"
        "|---|---|---|---|---|\n"
        "| ssd | 0.123 | 1234 | 7 | - |\n"
        "| gdn | - | - | - | OOM |")


def test_write_json_names_the_device_and_the_host(tmp_path):
    path = tmp_path / "sub" / "b.json"
    timing.write_json(path, "bench", [{"a": 1}], quiet=True, shapes="4x8192")
    record = json.loads(path.read_text())
    assert record["device"] == timing.device_name() and record["host"] == platform.node()
    assert (record["benchmark"], record["shapes"], record["rows"]) == ("bench", "4x8192",
                                                                       [{"a": 1}])


def test_device_name_is_the_device_kind(monkeypatch):
    device = types.SimpleNamespace(device_kind="NVIDIA H200", platform="gpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [device])
    assert timing.device_name() == f"NVIDIA H200 (gpu, jax {jax.__version__})"


def test_run_parts_runs_them_in_the_order_given_and_saves_each(tmp_path):
    """The order matters: flash_attention's table times the sweep's blocks when the sweep ran
    before it. A failed part is recorded and the others still run."""
    order = []

    def fails(args):
        order.append("check")
        raise ValueError("bad")

    parts = {"table": lambda args: order.append("table") or [1],
             "sweep": lambda args: order.append("sweep") or [2], "check": fails}
    out = tmp_path / "r.json"
    results = timing.run_parts(parts, "table,sweep,check", None, out, "b", doc_median=3)
    assert order == ["table", "sweep", "check"]
    record = json.loads(out.read_text())
    assert (record["table"], record["sweep"], record["doc_median"]) == ([1], [2], 3)
    assert record["check"] == results["check"] == {"error": "ValueError: bad"}


def test_relative_error_is_against_the_reference():
    assert timing.relative_error([2.0, 0.0], [1.0, 0.0]) == 1.0
    assert timing.relative_error([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert timing.relative_error([1.0], [0.0]) == pytest.approx(1e30)
