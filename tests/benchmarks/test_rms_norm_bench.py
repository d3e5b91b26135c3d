"""The norm benchmark's block-size variants: labels parse (none, all, a list; an unknown one is
refused by name), each is a valid change of the defaults at every benchmark shape, and a
variant row is checked and timed through the kernels in interpret mode."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from experiments.benchmarks import rms_norm
from pallas_kernels.rms_norm.block_sizes import default_block_sizes


def test_variant_labels_parse():
    assert rms_norm.parse_variants("none") == []
    assert rms_norm.parse_variants("all") == list(rms_norm.VARIANTS)
    assert rms_norm.parse_variants("backward 3 stages; forward rows x2") == [
        "backward 3 stages", "forward rows x2"]
    with pytest.raises(ValueError, match=r"unknown \['backward 2 stages'\]"):
        rms_norm.parse_variants("backward 2 stages")


@pytest.mark.parametrize("label", list(rms_norm.VARIANTS))
def test_every_variant_changes_the_defaults(label):
    for _, group, _, _ in rms_norm.SHAPES:
        base = default_block_sizes(group)
        assert dataclasses.replace(base, **rms_norm.VARIANTS[label](base)) != base


def test_a_variant_is_checked_and_timed(tmp_path, monkeypatch):
    out = tmp_path / "rms_norm.json"
    monkeypatch.setattr(rms_norm, "SHAPES", rms_norm.SHAPES[2:])  # Mamba-2's norm only
    monkeypatch.setattr(sys, "argv", ["rms_norm", "--interpret", "--batch", "1", "--length",
                                      "16", "--variants", "backward rows x2", "--out", str(out)])
    rms_norm.main()
    record = json.loads(out.read_text())
    checked = [r for r in record["check"] if r["variant"] == "backward rows x2"]
    assert len(checked) == 2 and all(r["passed"] for r in checked)
    timed = [r for r in record["table"] if r["impl"] == "pallas (backward rows x2)"]
    assert len(timed) == 1 and timed[0]["fwd_bwd_ms"] > 0
