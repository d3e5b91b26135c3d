"""The hand-set Mamba-1 → windowed-attention model solves selective copying exactly."""

import dataclasses

import pytest

from experiments.expressivity.construction import solution_accuracy, solution_config
from hybrid_jax.data.tasks import SelectiveCopyingConfig


@pytest.mark.parametrize("task", [
    SelectiveCopyingConfig(),
    # other distances and density, and length generalisation: exact at any length
    SelectiveCopyingConfig(num_tokens=8, min_distance=2, max_distance=4, number_prob=0.4,
                           seq_len=400),
], ids=["paper", "short-distances-length-400"])
def test_constructed_hybrid_is_exact(task):
    assert solution_accuracy(task, num_examples=32) == 1.0


def test_construction_is_a_two_layer_ssm_then_windowed_attention():
    task = SelectiveCopyingConfig()
    config = solution_config(task)
    assert [spec.type for spec in config.layers] == ["mamba1", "attention"]
    assert config.block_options(1).window == task.max_distance + 1 and config.ffn_dim == 0


def test_distances_beyond_one_rotary_period_are_refused():
    task = dataclasses.replace(SelectiveCopyingConfig(), max_distance=13)
    with pytest.raises(ValueError, match="max_distance=13 is too large"):
        solution_accuracy(task)
