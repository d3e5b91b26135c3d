"""The profile parser of `experiments/benchmarks/trace_summary.py`: exact sums on a small
GPU-shaped trace, and a real CPU trace of this jax version (the format it writes)."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from experiments.benchmarks import trace_summary


def _gpu_trace(path):
    meta = lambda pid, tid, kind, name: {"ph": "M", "pid": pid, "tid": tid, "name": kind,
                                         "args": {"name": name}}
    kernel = lambda tid, name, dur: {"ph": "X", "pid": 2, "tid": tid, "ts": 0, "dur": dur,
                                     "name": name}
    events = [meta(1, 0, "process_name", "/host:CPU"), meta(2, 0, "process_name",
                                                             "/device:GPU:0"),
              meta(2, 7, "thread_name", "Stream #7(compute)"),
              meta(2, 9, "thread_name", "XLA Ops"),  # derived from the kernels: not counted
              kernel(7, "flash_attention_dkv", 300.0), kernel(7, "flash_attention_dkv", 300.0),
              kernel(7, "sm90_xmma_gemm_bf16", 250.0), kernel(7, "loop_fusion.3", 150.0),
              kernel(9, "fusion.3", 1000.0),
              {"ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": 5000.0, "name": "host work"}]
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events + [{}]}, f)


def test_gpu_kernels_by_total_time(tmp_path):
    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    _gpu_trace(run / "perfetto_trace.json.gz")
    summary = trace_summary.summarize(tmp_path, steps=2)  # the directory: finds the file
    assert summary["events"] == 4 and "Stream #7" in summary["selection"]
    rows = summary["kernels"]
    assert [r["name"] for r in rows] == ["flash_attention_dkv", "sm90_xmma_gemm_bf16",
                                         "loop_fusion.3"]
    assert rows[0]["count"] == 2 and rows[0]["total_ms"] == 0.6 and rows[0]["share"] == 0.6
    assert rows[0]["ms_per_step"] == 0.3 and rows[0]["mean_us"] == 300.0
    assert summary["device_ms_per_step"] == pytest.approx(0.5)
    kinds = {r["category"]: r["share"] for r in summary["categories"]}
    assert kinds == pytest.approx({"attention": 0.6, "matmul": 0.25, "fusion": 0.15})


def test_a_real_cpu_trace(tmp_path):
    f = jax.jit(lambda a: jnp.sin(a @ a).sum())
    a = jnp.ones((64, 64))
    f(a).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(3):
            f(a).block_until_ready()
    summary = trace_summary.summarize(tmp_path, steps=3, process="/host:CPU",
                                      thread="XLAPjRtCpuClient|XLAEigen")
    assert summary["events"] > 0 and summary["device_ms_per_step"] > 0
    assert sum(r["share"] for r in summary["kernels"]) == pytest.approx(1.0)
    # A thread pattern that matches nothing falls back to every thread of the process.
    everything = trace_summary.summarize(tmp_path, process="/host:CPU", thread="no such")
    assert "no thread matches" in everything["selection"]
    assert everything["events"] >= summary["events"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no perfetto_trace"):
        trace_summary.summarize(tmp_path / "empty")


def _silu_square(x, w):
    y = jnp.tanh(x @ w) * 2 + 1
    return (jax.nn.silu(y) ** 2).sum()  # the line the fused elementwise ops come from


def test_kernel_sources_names_the_source_lines_of_a_fusion_forward_and_backward():
    compiled = jax.jit(jax.grad(_silu_square)).lower(jnp.ones((8, 8)), jnp.ones((8, 8))).compile()
    text = compiled.as_text()
    fusions = [line.split("=")[0].strip().lstrip("%").removeprefix("ROOT ").strip()
               for line in text.splitlines() if "kind=kLoop" in line]
    assert fusions, "expected a loop fusion in the CPU HLO"
    sources = trace_summary.kernel_sources(text, fusions + ["not_in_the_module"])
    assert "not_in_the_module" not in sources
    line = _silu_square.__code__.co_firstlineno + 2
    found = " ".join(" ".join(v) for v in sources.values())
    assert f"test_trace_summary.py:{line} _silu_square [fwd]" in found
    assert f"test_trace_summary.py:{line} _silu_square [bwd]" in found


def test_kernel_sources_reads_inline_source_metadata_of_older_xla():
    text = "\n".join([
        "%fused_computation.7 (p: f32[4]) -> f32[4] {",
        '  %m = f32[4] multiply(%p, %p), metadata={op_name="jit(f)/transpose(jvp())/mul" '
        'source_file="/x/hybrid_jax/nn/layers.py" source_line=210}',
        '  ROOT %a = f32[4] add(%m, %p), metadata={op_name="jit(f)/jvp()/add" '
        'source_file="/x/hybrid_jax/nn/layers.py" source_line=211}',
        "}",
        "ENTRY %main (p: f32[4]) -> f32[4] {",
        "  ROOT %loop_add_fusion.3 = f32[4] fusion(%p), kind=kLoop, calls=%fused_computation.7",
        "}"])
    want = ["layers.py:210 [bwd] ×1", "layers.py:211 [fwd] ×1"]
    # the trace names the kernel "loop_add_fusion_3" (XLA's GPU kernel names use "_" for ".")
    assert trace_summary.kernel_sources(text, ["loop_add_fusion.3", "loop_add_fusion_3"]) == {
        "loop_add_fusion.3": want, "loop_add_fusion_3": want}


def test_time_by_source_sums_kernels_by_their_dominant_function():
    text = "\n".join([
        "%f1 (p: f32[4]) -> f32[4] {",
        '  %a = f32[4] add(%p, %p), metadata={op_name="jit(f)/jvp()/add" '
        'source_file="/x/hybrid_jax/nn/layers.py" source_line=210}',
        '  ROOT %b = f32[4] add(%a, %p), metadata={op_name="jit(f)/jvp()/add" '
        'source_file="/x/hybrid_jax/nn/layers.py" source_line=212}',
        "}",
        "%f2 (p: f32[4]) -> f32[4] {",
        '  ROOT %c = f32[4] mul(%p, %p), metadata={op_name="jit(f)/jvp()/mul" '
        'source_file="/x/hybrid_jax/nn/layers.py" source_line=212}',
        "}",
        "ENTRY %main (p: f32[4]) -> f32[4] {",
        "  %fusion.1 = f32[4] fusion(%p), kind=kLoop, calls=%f1",
        "  ROOT %fusion.2 = f32[4] fusion(%fusion.1), kind=kLoop, calls=%f2",
        "}"])
    rows = [{"name": "fusion_1", "ms_per_step": 3.0}, {"name": "gemm", "ms_per_step": 2.0},
            {"name": "fusion_2", "ms_per_step": 1.0}]
    table = trace_summary.time_by_source(rows, text)
    # by function, not line: both fusions are layers.py's (this old format names no function)
    assert [(r["source"], r["ms_per_step"], r["kernels"], r["largest"]) for r in table] == [
        ("layers.py [fwd]", 4.0, 2, "fusion_1"), ("(not a fusion)", 2.0, 1, "gemm")]
