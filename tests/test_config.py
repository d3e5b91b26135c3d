"""Config validation, presets, overrides and JSON round trips."""

import dataclasses
import os
import subprocess
import sys

import pytest

from experiments import registry
from hybrid_jax import presets
from hybrid_jax.config import (
    ExperimentConfig,
    LayerSpec,
    MeshConfig,
    ModelConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    layer,
    to_dict,
)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=5), r"ModelConfig.num_heads=5 does not divide d_model=64"),
        (dict(num_kv_heads=3), r"num_kv_heads=3 does not divide num_heads=4"),
        (dict(window=-1), r"ModelConfig.window=-1"),
        (dict(dtype="float8"), r"ModelConfig.dtype='float8': expected one of"),
        (dict(layers=()), r"ModelConfig.layers=\(\): expected at least one layer"),
        (dict(layers=("attention", "mamba9")), r"layers\[1\] \('mamba9'\): unknown block type"),
        (dict(layers=(layer("attention", windw=3),)), r"unknown option\(s\) \['windw'\]"),
        (dict(layers=(layer("attention", window=0),)), r"window=0: attention needs window >= 1"),
        (dict(layers=(layer("attention", num_heads=3),)), r"num_heads=3 does not divide"),
        (dict(rope_fraction=1.5), r"rope_fraction=1.5"),
        (dict(position_embedding="sinusoidal"),
         r"position_embedding='sinusoidal': expected one of \['none', 'learned'\]"),
        (dict(position_embedding="learned"),
         r"max_positions=None: expected a positive integer with position_embedding='learned'"),
        (dict(max_positions=64), r"max_positions=64: expected None with position_embedding="),
    ],
)
def test_bad_model_configs_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_model_defaults_flow_into_layers():
    cfg = ModelConfig(layers=("attention", layer("attention", window=4)), window=16,
                      num_kv_heads=2)
    assert cfg.block_options(0).window == 16 and cfg.block_options(1).window == 4
    assert cfg.block_options(0).num_kv_heads == 2
    assert cfg.layers[0] == LayerSpec("attention")


def test_bad_train_and_mesh_configs():
    with pytest.raises(ValueError, match="TrainConfig.steps=0"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="at most one -1"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="needs 16 devices"):
        MeshConfig(data=4, fsdp=4).shape(8)
    assert MeshConfig(data=-1, tensor=2).shape(8) == (4, 1, 1, 2)


def test_every_preset_constructs_and_unknown_preset_fails():
    assert "transformer-125m" in presets.names() and "transformer-tiny" in presets.names()
    for name in presets.names():
        assert isinstance(presets.get(name), ModelConfig)
    assert any("tiny" in name for name in presets.names())
    with pytest.raises(ValueError, match="unknown preset 'gpt5'; available presets"):
        presets.get("gpt5")


def test_every_experiment_loads_and_round_trips_through_json():
    for name in registry.names():
        experiment = registry.get(name)
        assert from_dict(ExperimentConfig, to_dict(experiment)) == experiment
    with pytest.raises(ValueError, match="unknown experiment"):
        registry.get("nope")


def test_overrides_parse_by_type():
    experiment = registry.get("lm-gutenberg-transformer-125m")  # attention layers
    changed = apply_overrides(experiment, [
        "train.steps=7", "train.warmup_steps=7",
        "train.learning_rate=0.5", "model.window=none", "model.window=8",
        "model.tie_embeddings=false", "train.mesh.data=1", 'model.layers=["attention"]',
    ])
    assert changed.train.steps == 7 and changed.train.learning_rate == 0.5
    assert changed.model.window == 8 and changed.model.tie_embeddings is False
    assert changed.train.mesh == MeshConfig(data=1)
    assert changed.model.layers == (LayerSpec("attention"),)
    # a block option that is not a ModelConfig field goes to every layer that has it
    cosine = apply_overrides(experiment, ["model.cosine=true"])
    assert all(dict(s.options)["cosine"] for s in cosine.model.layers)
    for text, value in (("1", True), ("0", False), ("yes", True), ("no", False)):
        assert apply_overrides(experiment, [f"model.tie_embeddings={text}"]).model \
            .tie_embeddings is value


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.stepz=3", r"unknown config key 'stepz' in TrainConfig"),
        ("train.steps=three", r"cannot parse steps='three'"),
        ("model.num_heads=5", r"num_heads=5 does not divide"),
        ("model.flux=1", r"unknown model key 'flux'"),
        ("steps", r"must have the form key=value"),
    ],
)
def test_bad_overrides_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(registry.get(registry.names()[0]), [override])


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().d_model = 3


def test_hybrid_jax_data_points_the_lm_experiments_at_another_corpus_folder(tmp_path):
    code = ("from experiments import registry; e = registry.get('lm-wikitext2-transformer-tiny'); "
            "print(e.data.path)")
    env = {**os.environ, "HYBRID_JAX_DATA": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == f"{tmp_path}/wikitext-2-raw/wiki.train.raw"
