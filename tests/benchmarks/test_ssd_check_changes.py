"""`--check-changes FIELD=VALUE,...` (`timing.parse_changes`, `timing.changed_defaults`): the SSD
GPU check (linear_ops) runs every case with those BlockSizes fields changed in its default
tiles, and the defaults come back afterwards."""

from __future__ import annotations

import argparse

import pytest

from experiments.benchmarks import ssd_kernel
from experiments.benchmarks.timing import parse_changes
from pallas_kernels.ssd import api
from pallas_kernels.ssd.block_sizes import BlockSizes


def test_the_check_runs_its_cases_on_the_changed_defaults(monkeypatch):
    seen = []
    monkeypatch.setattr(ssd_kernel, "_check_rows",
                        lambda rows: seen.append(api.default_block_sizes(64, 128)) or rows)
    original = api.default_block_sizes
    ssd_kernel.part_check(parse_changes("grads_summed_scores=True,grads_num_stages=2",
                                         BlockSizes))
    assert seen[0].grads_summed_scores and seen[0].grads_num_stages == 2
    assert seen[0].chunk == original(64, 128).chunk  # the rest stays the default's
    assert api.default_block_sizes is original
    ssd_kernel.part_check()
    assert seen[1] == original(64, 128)


@pytest.mark.parametrize("text", ["nope=1", "grads_num_stages", "grads_num_stages="])
def test_bad_changes_are_refused_with_what_was_expected(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected FIELD=VALUE"):
        parse_changes(text, BlockSizes)
