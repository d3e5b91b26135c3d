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
    # Residual channels: V tokens, the constant, the "no number yet" flag, the 6 distances
    # 5..10 and the two copy channels; one 4-channel head.
    assert config.d_model == task.vocab_size + 1 + 1 + 6 + 2 and config.head_dim == 4


def test_distances_beyond_one_rotary_period_are_refused():
    task = dataclasses.replace(SelectiveCopyingConfig(), max_distance=13)
    with pytest.raises(ValueError, match="max_distance=13 is too large"):
        solution_accuracy(task)


def test_constructed_parameters_must_match_the_model():
    """`_model_with` sets every parameter by path: a missing, unknown or misshapen one is named."""
    import numpy as np

    from experiments.expressivity.construction import _model_with
    from hybrid_jax.config import ModelConfig, layer

    config = ModelConfig(layers=(layer("attention"),), vocab_size=3, d_model=4, num_heads=1,
                         ffn_dim=0)
    params = {"embed.table": np.zeros((3, 4)), "final_norm.scale": np.ones(4),
              "blocks.0.mixer_norm.scale": np.ones(4),
              **{f"blocks.0.mixer.{n}_proj.kernel": np.zeros((4, 1, 4)) for n in "qkv"},
              "blocks.0.mixer.o_proj.kernel": np.full((1, 4, 4), 0.5)}
    model = _model_with(config, params)
    assert float(model.blocks[0].mixer.o_proj.kernel[...].sum()) == 8.0
    with pytest.raises(ValueError, match=r"\['lm_head.kernel'\] do not exist; \[\] are not set"):
        _model_with(config, {**params, "lm_head.kernel": np.zeros((4, 3))})
    with pytest.raises(ValueError, match=r"\[\] do not exist; \['final_norm.scale'\] are not"):
        _model_with(config, {k: v for k, v in params.items() if k != "final_norm.scale"})
    with pytest.raises(ValueError, match=r"constructed shape \(5,\) != parameter shape \(4,\)"):
        _model_with(config, {**params, "final_norm.scale": np.ones(5)})
