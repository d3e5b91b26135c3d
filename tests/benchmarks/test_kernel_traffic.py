"""`kernel_traffic`: every Pallas kernel's compulsory bytes and product FLOPs from the jaxpr,
checked on kernels whose numbers are known by hand, and its command on two ops."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from experiments.benchmarks import kernel_traffic
from experiments.dispatch_audit import traced_for
from hybrid_jax import ops


def _looped_products(x_ref, w_ref, o_ref):
    """o = Σ over 3 static steps of x @ w: one program's products 3 · 2·16·8·32 FLOPs."""
    o_ref[...] = jax.lax.fori_loop(
        0, 3, lambda i, acc: acc + jnp.dot(x_ref[...], w_ref[...]), jnp.zeros((16, 8)))


def _run_time_loop(x_ref, w_ref, o_ref):
    """As many products as the program's index + 1: a loop of run-time length."""
    steps = pl.program_id(0) + 1
    o_ref[...] = jax.lax.fori_loop(
        0, steps, lambda i, acc: acc + jnp.dot(x_ref[...], w_ref[...]), jnp.zeros((16, 8)))


def _call(body, x, w):
    return pl.pallas_call(
        body, grid=(2,), in_specs=[pl.BlockSpec((16, 32), lambda i: (i, 0)),
                                   pl.BlockSpec((32, 8), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((16, 8), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((32, 8), jnp.float32), interpret=True,
        name=body.__name__.strip("_"))(x, w)


X = jax.ShapeDtypeStruct((32, 32), jnp.float32)
W = jax.ShapeDtypeStruct((32, 8), jnp.float32)


def test_bytes_and_flops_of_a_kernel_known_by_hand():
    (kernel,) = kernel_traffic.kernels(lambda x, w: _call(_looped_products, x, w), X, W)
    assert (kernel.name, kernel.launches, kernel.programs) == ("looped_products", 1, 2)
    assert (kernel.bytes_in, kernel.bytes_out) == ((32 * 32 + 32 * 8) * 4, 32 * 8 * 4)
    assert kernel.flops == 2 * 3 * (2 * 16 * 8 * 32) and not kernel.dynamic_loops


def test_launches_summed_by_name_and_run_time_loops_flagged():
    def two(x, w):  # the run-time loop twice (summed), inside a jit, then the static one
        inner = jax.jit(lambda x, w: _call(_run_time_loop, x, w))
        return inner(x, w) + inner(x, w) + _call(_looped_products, x, w)

    found = {k.name: k for k in kernel_traffic.kernels(two, X, W)}
    dynamic = found["run_time_loop"]
    assert (dynamic.launches, dynamic.programs, dynamic.dynamic_loops) == (2, 4, True)
    assert dynamic.flops == 2 * 2 * (2 * 16 * 8 * 32)  # counted once a program
    assert not found["looped_products"].dynamic_loops


def test_a_library_kernel_traced_for_the_gpu():
    """The RMSNorm's GPU kernel, traced on the CPU: x and γ in, y out, no products."""
    x = jax.ShapeDtypeStruct((2, 64, 256), jnp.bfloat16)
    scale = jax.ShapeDtypeStruct((256,), jnp.float32)
    with traced_for("gpu"):
        (kernel,) = kernel_traffic.kernels(
            lambda x, s: ops.rms_norm(x, s, implementation="pallas"), x, scale)
    assert kernel.name == "rms_norm_forward" and kernel.flops == 0
    assert (kernel.bytes_in, kernel.bytes_out) == (2 * 64 * 256 * 2 + 256 * 4, 2 * 64 * 256 * 2)


def test_rates_against_a_profiled_time():
    kernel = kernel_traffic.Kernel("k", 1, 8, bytes_in=3e9, bytes_out=1e9, flops=400e9)
    rates = kernel_traffic.against_time(kernel, 2.0, tflops=800, tb_s=4.0)
    assert rates["TB_s"] == pytest.approx(2.0) and rates["TFLOP_s"] == pytest.approx(200)
    assert rates["floor_ms"] == pytest.approx(1.0) and rates["over_floor"] == pytest.approx(2)
    assert kernel_traffic.against_time(None, 2.0) == {}  # an XLA fusion
    # Faster than its floor: work skipped at run time (a kernel whose programs exit early)
    skipped = kernel_traffic.against_time(kernel, 0.5, tflops=800, tb_s=4.0)
    assert skipped["skipped_work"] and "TB_s" not in skipped


def test_command_rows_for_each_op_and_pass(tmp_path, monkeypatch):
    out = tmp_path / "kernel_traffic.json"
    monkeypatch.setattr(sys, "argv", ["kernel_traffic", "--ops", "ssd,gated_delta_rule",
                                      "--shape", "1x128x2x64x64", "--documents", "40",
                                      "--out", str(out)])
    kernel_traffic.main()
    rows = json.loads(out.read_text())["rows"]
    names = {}
    for row in rows:
        names.setdefault((row["op"], row["pass"]), set()).add(row["kernel"])
    for op in ("ssd", "gated_delta_rule"):
        # (a GDN forward alone runs its fused state-and-output pass, training the split one)
        assert 0 < len(names[op, "fwd"]) < len(names[op, "fwd+bwd"])
    assert all(r["GB_in"] > 0 and r["GB_out"] > 0 and r["GFLOP"] > 0 for r in rows)
