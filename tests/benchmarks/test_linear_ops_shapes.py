"""linear_ops at several head layouts: rows of ours, fla's and cuDNN's pair only at one shape,
and the GDN kernel variants start from each shape's own default tiles; the ratio columns, fla's
fastest of several runs and the issue's targets by hand."""

from __future__ import annotations

import argparse
import dataclasses
import sys

import pytest

from experiments.benchmarks import linear_ops
from experiments.benchmarks.linear_ops import (
    GDN_VARIANTS,
    gdn_default_blocks,
    gdn_variants,
    kernel_variants,
    parse_variants,
)
from experiments.benchmarks.mixer_shapes import MixerShape
from pallas_kernels.delta_rule.block_sizes import default_block_sizes

GDN = "gated_delta_rule"
SMALL, WIDE = MixerShape(2, 32), MixerShape(2, 32, 3, 64, 128)  # one B × T, two head layouts


def fake_measure(fn, inputs, **_):
    """Ours (5 inputs) 10 × H ms, cuDNN (q, k, v) H ms: each ratio to cuDNN is 10 when paired
    at one shape, not when paired across H16 and H3."""
    heads = inputs[0].shape[2]
    ms = heads * (10.0 if len(inputs) == 5 else 1.0)
    return {"fwd_ms": ms, "fwd_bwd_ms": 2 * ms}


def test_ratios_pair_rows_of_one_shape(monkeypatch):
    peer_lines = [{"fla_version": "x"}] + [
        {"op": GDN, "impl": "fla", **shape.fields(GDN), "fwd_ms": ms, "fwd_bwd_ms": 2 * ms}
        for shape, ms in ((SMALL, 4.0), (WIDE, 2.0))]
    monkeypatch.setattr(linear_ops, "run_json_lines", lambda *a, **k: (peer_lines, ""))
    monkeypatch.setattr(linear_ops, "measure", fake_measure)
    peers = linear_ops.fla_rows("2x32,2x32x3x64x128", GDN, timeout=3)
    assert len(peers) == 2  # same op, B and T: two shapes
    args = argparse.Namespace(shapes="2x32,2x32x3x64x128", ops=GDN, impls="xla",
                              variants="all")
    emitted = []
    rows = linear_ops.part_table(args, peers, None, deadline=float("inf"),
                                 emit=emitted.append)
    ours = {(r["H"], r["K"], r["V"]): r for r in rows if r["impl"] == "xla"}
    assert set(ours) == {(16, 128, 128), (3, 64, 128)}
    assert ours[16, 128, 128]["vs_fla_fwd"] == 160.0 / 4.0
    assert ours[3, 64, 128]["vs_fla_fwd_bwd"] == 60.0 / 4.0
    assert all(r["vs_cudnn_fwd_bwd"] == 10.0 for r in ours.values())
    cudnn = [(r["H"], r["K"], r["V"]) for r in emitted if r["op"] == "attention"]
    assert cudnn == [(16, 128, 128), (3, 64, 64)]  # v at K where V != K


def test_gdn_variants_start_from_the_shapes_default():
    issue = MixerShape(4, 8192)
    assert gdn_default_blocks(issue) == default_block_sizes(128, 128)
    gdn_340m = MixerShape(4, 8192, 3, 256, 512)  # two V slices of 256, 12 sequences
    base = gdn_default_blocks(gdn_340m)
    assert base == default_block_sizes(256, 256)
    assert (base.value_block, base.gradient_num_warps, base.split_outputs) == (64, 4, True)
    variants = gdn_variants(gdn_340m)
    changes = dict(GDN_VARIANTS)
    for label, blocks in variants.items():
        assert blocks == dataclasses.replace(base, **changes[label]) != base
    assert len(set(variants.values())) == len(variants)
    assert variants["split outputs V16"].value_block == 16
    assert variants["gradients 8 warps"].gradient_num_warps == 8
    assert "split outputs V64" not in variants and "gradients 4 warps" not in variants
    assert "forward V64 key blocks 2 stages" not in variants  # the default (Round 12)
    assert "sequential 8 warps" not in variants  # 8 warps are its training default
    assert variants["sequential 2 warps V16"].state_num_warps == 2  # Round 8's sweep
    at_issue = gdn_variants(issue)  # V tile 32 and 4 gradient warps are the default there too
    assert "split outputs V32" not in at_issue and "gradients 4 warps" not in at_issue
    assert at_issue["fused outputs"].value_block == 32
    assert "fused outputs V32" not in at_issue  # the same tiles as "fused outputs"
    small = gdn_variants(MixerShape(4, 8192, 12, 64, 64))
    assert "gradients V128" not in small  # wider than V


def test_kernel_variants_keep_the_labels_asked_for():
    shape = MixerShape(4, 8192, 3, 256, 512)
    assert list(kernel_variants(GDN, shape, only={"fused outputs", "gradients 8 warps"})) == [
        "pallas (fused outputs)", "pallas (gradients 8 warps)"]
    assert kernel_variants("gated_slot_attention", shape) == {}
    assert parse_variants("all") == list(linear_ops.VARIANT_LABELS)
    assert parse_variants("none") == []
    assert parse_variants("fused outputs; gradients 4 warps") == ["fused outputs",
                                                                  "gradients 4 warps"]
    with pytest.raises(ValueError, match="unknown \\['fused'\\]"):
        parse_variants("fused")


def test_bad_shapes_stop_the_run_before_the_peer(monkeypatch, capsys):
    monkeypatch.setattr(linear_ops, "run_json_lines", lambda *a, **k: pytest.fail("peer ran"))
    monkeypatch.setattr(sys, "argv", ["linear_ops", "--shapes", "4x8192x3"])
    with pytest.raises(SystemExit):
        linear_ops.main()
    assert "got 3 numbers" in capsys.readouterr().err


def test_ratio_columns_by_hand():
    """Each ratio is ours / the peer's, of the time its column names (fwd, fwd+bwd)."""
    row = {"fwd_ms": 2.0, "fwd_bwd_ms": 9.0}
    linear_ops._ratios(row, {"fwd_ms": 4.0, "fwd_bwd_ms": 3.0}, {"fwd_ms": 1.0,
                                                                 "fwd_bwd_ms": 6.0})
    assert row == {"fwd_ms": 2.0, "fwd_bwd_ms": 9.0, "vs_fla_fwd": 0.5, "vs_fla_fwd_bwd": 3.0,
                   "vs_cudnn_fwd_bwd": 1.5}
    row = {"fwd_ms": 2.0, "error": "fwd+bwd failed"}
    linear_ops._ratios(row, None, {"fwd_ms": 1.0, "fwd_bwd_ms": 6.0})
    assert row == {"fwd_ms": 2.0, "error": "fwd+bwd failed"}


def test_several_fla_runs_keep_each_fastest_time(monkeypatch):
    row = lambda fwd, fwd_bwd: {"op": GDN, "impl": "fla", **SMALL.fields(GDN),  # noqa: E731
                                "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}
    runs = iter([[row(1.0, 3.0)], [row(0.8, 3.5)]])
    monkeypatch.setattr(linear_ops, "run_json_lines", lambda *a, **k: (next(runs), ""))
    [peer] = linear_ops.fla_rows("2x32", GDN, timeout=100, runs=2)
    assert (peer["fwd_ms"], peer["fwd_bwd_ms"]) == (0.8, 3.0)
    assert (peer["fwd_ms_runs"], peer["fwd_bwd_ms_runs"]) == ([1.0, 0.8], [3.0, 3.5])


def test_ops_of_one_shape_share_the_cudnn_row_and_keep_fla_rows(monkeypatch):
    """SSD and the gated delta rule at one [B, T, H, K]: cuDNN is timed once, and both ops'
    rows have their ratio to it; the peer's rows are in the table."""
    monkeypatch.setattr(linear_ops, "measure", fake_measure)
    peers = [{"op": op, "impl": "fla", **SMALL.fields(op), "fwd_ms": 4.0, "fwd_bwd_ms": 8.0}
             for op in ("ssd", GDN)]
    args = argparse.Namespace(shapes="2x32", ops=f"ssd,{GDN}", impls="xla", variants="none")
    rows = linear_ops.part_table(args, peers, None, deadline=float("inf"), emit=lambda r: None)
    ours = {r["op"]: r for r in rows if r["impl"] == "xla"}
    assert set(ours) == {"ssd", GDN}
    assert all(r["vs_cudnn_fwd_bwd"] == 10.0 and r["vs_fla_fwd"] == 40.0
               for r in ours.values())
    assert [r["impl"] for r in rows].count("cudnn causal") == 1
    assert sorted(r["op"] for r in rows if r["impl"] == "fla") == [GDN, "ssd"]


def test_targets_take_our_fastest_row_against_the_peer(capsys):
    shape = MixerShape(2, 32)
    at = lambda op, impl, fwd, fwd_bwd: {"op": op, "impl": impl, **shape.fields(op),  # noqa: E731
                                         "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}
    rows = [at("attention", "cudnn causal", 1.0, 4.0), at("ssd", "xla", 2.0, 6.0),
            at("ssd", "pallas", 1.0, 3.0), at("ssd", "fla", 1.25, 2.0)]
    linear_ops.print_targets(rows, shape)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        "target ssd fwd_ms: ours (pallas) 1 ms = 0.80 x fla 1.25 ms; needs <= 0.83: met",
        "target ssd fwd_bwd_ms: ours (pallas) 3 ms = 0.75 x cudnn 4 ms; needs <= 1.50: met"]
    assert "target gated_delta_rule fwd_ms vs fla: not measured" in lines


def test_ssd_inputs_read_k_as_the_state_size_and_v_as_the_head_dim():
    import jax

    x, dt, a, b, c = linear_ops.make_inputs("ssd", WIDE, jax.random.key(0))
    assert x.shape == (2, 32, 3, 128) and b.shape == c.shape == (2, 32, 1, 64)
    assert dt.shape == (2, 32, 3) and a.shape == (3,)
    q, k, v = linear_ops.make_inputs("attention", WIDE, jax.random.key(0))
    assert q.shape == k.shape == v.shape == (2, 32, 3, 64)
