"""The per-kernel profile script runs end to end (CPU: the trace holds no GPU kernels, so the
rows are empty, but every op and pass must compile, run and be written without an error), at a
shape given with heads and dims (V != K)."""

from __future__ import annotations

import json
import sys

import jax

from experiments.benchmarks import op_kernels


def test_op_kernels_writes_every_pass_without_errors(tmp_path, monkeypatch):
    out = tmp_path / "op_kernels.json"
    monkeypatch.setattr(sys, "argv", ["op_kernels", "--ops", "ssd,native_hybrid_attention",
                                      "--shape", "1x64x2x16x32", "--impl", "xla", "--window", "16",
                                      "--out", str(out)])
    op_kernels.main()
    record = json.loads(out.read_text())
    assert record["shape"] == "1x64x2x16x32" and record["impl"] == "xla" and record["window"] == 16
    assert not [row for row in record["rows"] if "error" in row]


def test_packed_documents_reach_every_op(tmp_path, monkeypatch):
    """`--documents`: segment ids of packed documents in every op's call (a call that dropped
    them would run, so the ids are checked to have several documents a row and be recorded)."""
    out = tmp_path / "op_kernels.json"
    monkeypatch.setattr(sys, "argv", ["op_kernels", "--ops", "ssd,gated_delta_rule",
                                      "--shape", "2x64x2x16x32", "--impl", "xla",
                                      "--documents", "12", "--out", str(out)])
    seen = []
    real = op_kernels.op_and_inputs
    monkeypatch.setattr(op_kernels, "op_and_inputs",
                        lambda *a, **kw: seen.append(a[-1]) or real(*a, **kw))
    op_kernels.main()
    record = json.loads(out.read_text())
    assert record["documents"] == 12 and not [row for row in record["rows"] if "error" in row]
    assert len(seen) == 2 and all(ids.shape == (2, 64) and int(ids[0].max()) >= 2 for ids in seen)


def test_forwards_profiles_each_variants_forward(tmp_path, monkeypatch):
    """`--variants LABEL --forwards`: each variant's forward is profiled beside its fwd+bwd (the
    pallas rung replaced by the XLA one, which runs on the CPU)."""
    real = op_kernels.op_and_inputs
    monkeypatch.setattr(op_kernels, "op_and_inputs", lambda name, shape, window, impl, ids, **kw:
                        real(name, shape, window, "xla", ids, **kw))
    monkeypatch.setattr(op_kernels, "kernel_variants", lambda name, shape, **_: {
        "v": real(name, shape, 16, "xla")[0]})
    passes = []
    monkeypatch.setattr(op_kernels, "profile", lambda fn, inputs: passes.append(
        [float(x.sum()) for x in jax.tree.leaves(fn(*inputs))]) or {
            "device_ms_per_step": 0.0, "kernels": []})
    monkeypatch.setattr(op_kernels.trace_summary, "print_summary", lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["op_kernels", "--ops", "ssd", "--shape", "1x64x2x16x32",
                                      "--variants", "grads 2 stages", "--forwards",
                                      "--out", str(tmp_path / "o.json")])
    op_kernels.main()
    fwd, fwd_bwd, fwd_v, fwd_bwd_v = passes  # default fwd, fwd+bwd, then the variant's
    assert fwd == fwd_v and fwd_bwd == fwd_bwd_v and len(fwd) == 1 and len(fwd_bwd) == 5


def test_skip_d_gives_the_ssd_its_d(tmp_path, monkeypatch):
    """`--skip-d`: the SSD takes Mamba-2's D as a sixth input, differentiated too, and D
    changes the op's output (so it reached the call)."""
    passes = []
    monkeypatch.setattr(op_kernels, "profile", lambda fn, inputs: passes.append(
        (len(inputs), [float(x.sum()) for x in jax.tree.leaves(fn(*inputs))])) or {
            "device_ms_per_step": 0.0, "kernels": []})
    monkeypatch.setattr(op_kernels.trace_summary, "print_summary", lambda *a: None)
    argv = ["op_kernels", "--ops", "ssd", "--shape", "1x64x2x16x32", "--impl", "xla",
            "--out", str(tmp_path / "o.json")]
    for extra in ([], ["--skip-d"]):
        monkeypatch.setattr(sys, "argv", argv + extra)
        op_kernels.main()
    plain_fwd, plain_fwd_bwd, skip_fwd, skip_fwd_bwd = passes  # (inputs, output sums)
    assert (plain_fwd[0], skip_fwd[0]) == (5, 6)
    assert (len(plain_fwd_bwd[1]), len(skip_fwd_bwd[1])) == (5, 6)
    assert plain_fwd[1] != skip_fwd[1]
    assert json.loads((tmp_path / "o.json").read_text())["skip_d"] is True
