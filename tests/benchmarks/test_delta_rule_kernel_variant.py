"""`delta_rule_kernel --variant LABEL` checks and times the op's pallas rung at its default
tiles changed as linear_ops' GDN variant of that label (a variant's GPU accuracy check)."""

from __future__ import annotations

import sys

import pytest

from experiments.benchmarks import delta_rule_kernel
from pallas_kernels.delta_rule import api


def run_main(monkeypatch, *argv):
    seen = {}

    def part(args, budget):
        seen["blocks"] = api.default_block_sizes(128, 128)
        return []

    monkeypatch.setattr(delta_rule_kernel, "PARTS", {"check": part})
    monkeypatch.setattr(api, "default_block_sizes", api.default_block_sizes)  # restored after
    monkeypatch.setattr(delta_rule_kernel, "write_json", lambda *a, **kw: None)
    monkeypatch.setattr(sys, "argv", ["delta_rule_kernel", "--check", *argv])
    delta_rule_kernel.main()
    return seen["blocks"]


def test_a_variant_changes_the_default_tiles_the_op_runs(monkeypatch):
    assert not run_main(monkeypatch).tf32_merges
    blocks = run_main(monkeypatch, "--variant", "prepare TF32 merges")
    assert blocks.tf32_merges and blocks.split_gradients  # the rest stays the default's


def test_an_unknown_variant_is_refused_with_the_labels(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_main(monkeypatch, "--variant", "nope")
    assert "unknown 'nope'" in capsys.readouterr().err
