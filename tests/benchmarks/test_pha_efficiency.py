"""pha_efficiency's schedule of parts and its ratios against the baseline (no device work)."""

import pytest

from experiments.benchmarks.pha_efficiency import plan, ratios


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
