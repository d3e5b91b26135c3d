"""The logit-statistics benchmark in interpret mode: its check passes on the special rows
(ties, NaN, ±∞, out-of-range targets), the table times both rungs and a variant, and every
variant label is a valid change of the default tiles."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from experiments.benchmarks import logit_stats
from pallas_kernels.logit_stats.block_sizes import BlockSizes


@pytest.mark.parametrize("label", list(logit_stats.VARIANTS))
def test_every_variant_changes_the_defaults(label):
    assert dataclasses.replace(BlockSizes(), **logit_stats.VARIANTS[label]) != BlockSizes()


def test_check_and_table_in_interpret_mode(tmp_path, monkeypatch):
    out = tmp_path / "logit_stats.json"
    monkeypatch.setattr(sys, "argv", ["logit_stats", "--interpret", "--rows", "9", "--vocab",
                                      "40", "--variants", "2 rows", "--out", str(out)])
    logit_stats.main()
    record = json.loads(out.read_text())
    assert [r["pass"] for r in record["check"]] == [True]
    assert record["check"][0]["sum_exp_rel"] < 1e-5
    assert [r["rung"] for r in record["table"]] == ["xla", "pallas", "pallas, 2 rows"]
    assert all(r["ms"] > 0 for r in record["table"])
