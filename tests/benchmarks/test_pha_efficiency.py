"""pha_efficiency's schedule of parts, its profile steps and its ratios against the baseline."""

import json

import pytest

from experiments.benchmarks.pha_efficiency import (
    block_minus_branches,
    main,
    plan,
    profile_steps,
    ratios,
)


def test_parts_run_in_the_order_given():
    assert plan(["train", "profile", "inference"], [8192, 2048], 512) == [
        ("train", 8192), ("train", 2048), ("profile", 8192), ("inference", 512)]
    assert plan(["inference", "train"], [2048, 32768], 512) == [
        ("inference", 512), ("train", 2048), ("train", 32768)]
    with pytest.raises(ValueError, match="expected some of"):
        plan(["trian"], [2048], 512)


def test_every_model_is_compared_with_the_last():
    rows = [{"model": m, "T": 8192, "tokens_per_s": s, "mem_GiB": g, "remat": "none"}
            for m, s, g in (("pha", 150.0, 30.0), ("pha-w512", 250.0, 20.0),
                            ("base", 200.0, 40.0))]
    out = {r["model"]: r for r in ratios(rows, ["pha", "pha-w512", "base"])}
    assert out["pha"]["tokens_per_s_change_%"] == pytest.approx(-25.0)
    assert out["pha-w512"]["memory_change_%"] == pytest.approx(-50.0)
    assert set(out) == {"pha", "pha-w512"}


def test_whole_blocks_are_profiled_right_after_the_gss_branch(tmp_path):
    models = ["pha-tiny", "attention-only-tiny"]
    steps, branches = profile_steps(models, 16, 32, trace_top=0, hlo_stem=str(tmp_path / "x"))
    labels = [label for label, _ in steps]
    assert labels[:3] == ["pha-tiny gss", "pha-tiny block", "attention-only-tiny block"]
    assert labels[-2:] == ["gss pieces", "gss trace"]
    assert branches == {"pha-tiny": ("gss", "attention", "dual_ffn"),
                        "attention-only-tiny": ("mixer", "ffn")}
    (row,) = dict(steps)["pha-tiny block"]()
    assert row["part"] == "pha-tiny block" and row["fwd_bwd_ms"] > 0, row
    assert "fusion" in (tmp_path / "x_block_hlo.txt").read_text()


def test_block_minus_branches_per_model():
    rows = [{"part": f"m {p}", "T": 8, "B": 2, "fwd_bwd_ms": ms, "temp_MiB": mib}
            for p, ms, mib in (("block", 10.0, 50.0), ("a", 3.0, 10.0), ("b", 4.0, 20.0))]
    (out,) = block_minus_branches(rows + [{"part": "n block", "fwd_bwd_ms": 1.0}],
                                  ["m", "n"], {"m": ("a", "b"), "n": ("c",)})
    assert out["part"] == "m block - sum of branches"
    assert out["fwd_bwd_ms"] == pytest.approx(3.0) and out["temp_MiB"] == pytest.approx(20.0)


def test_a_training_row_runs_end_to_end_unscanned(tmp_path, capfd):
    """The script's own argument set drives `train_throughput.run_one` (a field it reads but
    the script did not set once crashed every training row), and its table prints the columns
    the rows hold (a renamed MFU column once printed "-"). Batch 8: the test devices' count."""
    out = tmp_path / "pe.json"
    assert main(["--models", "transformer-tiny", "--lengths", "32", "--tokens", "256",
                 "--steps", "1", "--parts", "train", "--no-scan", "--matmul-size", "128",
                 "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row and row["scan"] is False and row["tokens_per_s"] > 0, row
    header, first = [line.split() for line in capfd.readouterr().out.splitlines()
                     if line.startswith(("model ", "transformer-tiny "))][:2]
    assert "mfu_model_matmul" in header
    assert first[header.index("mfu_model_matmul")] != "-", (header, first)
