"""Config validation, presets, overrides and JSON round trips."""

import dataclasses
import json
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
    ModeSchedule,
    TrainConfig,
    apply_overrides,
    from_dict,
    layer,
    replace_path,
    to_dict,
)
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.text import TextConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=5), r"ModelConfig.num_heads=5 does not divide d_model=64"),
        (dict(num_kv_heads=3), r"num_kv_heads=3 does not divide num_heads=4"),
        (dict(window=-1), r"ModelConfig.window=-1"),
        (dict(dtype="float8"), r"ModelConfig.dtype='float8': expected one of"),
        (dict(layers=()), r"ModelConfig.layers=\(\): expected at least one layer"),
        (dict(layers=("attention", "mamba9")), r"layers\[1\] \('mamba9'\): unknown block type"),
        (dict(layers=(layer("attention", windw=3),)),
         r"unknown option\(s\) \['windw'\] \(did you mean 'window'\?\); allowed"),
        (dict(layers=(layer("attention", window=0),)), r"window=0: attention needs window >= 1"),
        (dict(layers=(layer("attention", num_heads=3),)), r"num_heads=3 does not divide"),
        (dict(rope_fraction=1.5), r"rope_fraction=1.5"),
        (dict(position_embedding="sinusoidal"),
         r"position_embedding='sinusoidal': expected one of \['none', 'learned'\]"),
        (dict(position_embedding="learned"),
         r"max_positions=None: expected a positive integer with position_embedding='learned'"),
        (dict(max_positions=64), r"max_positions=64: expected None with position_embedding="),
        # A layer's own RoPE base: accepted, then a NaN-angle error at the first forward call
        # naming no layer.
        (dict(layers=(layer("attention", rope_theta=0.0),)),
         r"layers\[0\] \('attention'\): AttentionOptions.rope_theta=0.0: expected a finite "
         r"value in \(0.0, inf\)"),
        (dict(layers=("attention", layer("nha", rope_theta=-1.0))),
         r"layers\[1\] \('nha'\): NHAOptions.rope_theta=-1.0"),
        (dict(layers=(layer("oryx", rope_theta=float("nan")),)), r"OryxOptions.rope_theta=nan"),
        # Initialisation ranges with inf / NaN: the model's parameters and outputs were NaN.
        (dict(layers=(layer("mamba2", dt_max=float("inf")),)),
         r"Mamba2Options.dt_max=inf: expected a finite number"),
        (dict(layers=(layer("mamba2", a_init_max=float("inf")),)), r"a_init_max=inf"),
        (dict(layers=(layer("mamba1", dt_init_floor=float("nan")),)),
         r"Mamba1Options.dt_init_floor=nan"),
        (dict(layers=(layer("gss", dt_max=float("inf")),)), r"GSSOptions.dt_max=inf"),
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
        # not JSON: the error said only "Expecting value: line 1 column 1 (char 0)"
        ("model.layers=gdn,attention",
         r"expected a JSON list, e\.g\. '\[\"a\", \"b\"\]', got 'gdn,attention' \(not JSON"),
        ("model=pha-tinny", r"unknown preset 'pha-tinny' \(did you mean 'pha-tiny'\?\)"),
        ("model.mesh=1", r"unknown model key 'mesh'"),
        ("train.mesh={", r"expected a JSON object of MeshConfig's fields.* \(or one field "
                         r"at a time: mesh\.FIELD=VALUE\), got '\{' \(not JSON"),
        ("steps", r"must have the form key=value"),
    ],
)
def test_bad_overrides_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(registry.get(registry.names()[0]), [override])


def test_a_preset_name_sets_the_whole_model_and_model_fields_apply_on_top():
    experiment = registry.get("mqar-hybrid-tiny")
    for order in (["model=pha-tiny", "model.vocab_size=300"],
                  ["model.vocab_size=300", "model=pha-tiny"]):
        assert apply_overrides(experiment, order).model == dataclasses.replace(
            presets.get("pha-tiny"), vocab_size=300)
    assert apply_overrides(experiment, ["model=gdn-tiny"]).model == presets.get("gdn-tiny")


def test_a_data_kind_sets_the_whole_data_config_and_data_fields_apply_on_top():
    """`data=mqar` was refused as "expected a registered data config (kinds: [... 'mqar' ...])"."""
    experiment = registry.get("mqar-hybrid-tiny")
    for order in (["data=text", "data.path=a.txt"], ["data.path=a.txt", "data=text"]):
        assert apply_overrides(experiment, order).data == TextConfig(path="a.txt")
    assert apply_overrides(experiment, ['data={"kind": "mqar", "seq_len": 32}']).data == \
        MQARConfig(seq_len=32)
    with pytest.raises(ValueError, match=r"unknown data kind 'mqr' \(did you mean 'mqar'\?\)"):
        apply_overrides(experiment, ["data=mqr"])
    with pytest.raises(ValueError, match=r"expected a JSON object of a data config"):
        apply_overrides(experiment, ["data={1"])


def test_override_values_parse_by_type_exactly():
    model = ModelConfig(window=8)
    for text in ("none", "None", "NULL", "null"):
        assert apply_overrides(model, [f"window={text}"]).window is None
    for text, value in (("TRUE", True), ("False", False)):
        assert apply_overrides(model, [f"tie_embeddings={text}"]).tie_embeddings is value
    # "none" is a string where the field takes no None
    modes = TrainConfig(mode_schedule=ModeSchedule(pattern="linear"))
    assert apply_overrides(modes, ["mode_schedule.pattern=none"]).mode_schedule.pattern == "none"
    # spaces around the key and the value go; a value may itself hold "="
    assert apply_overrides(model, [" tie_embeddings = false "]).tie_embeddings is False
    mesh = apply_overrides(TrainConfig(), ['mesh.axis_rule_overrides=["embed=none"]']).mesh
    assert mesh.axis_rule_overrides == ("embed=none",)
    # a dataclass from JSON, then a nested key on top of it, in either order
    for order in (1, -1):
        train = apply_overrides(TrainConfig(), ['mesh={"data": 2}', "mesh.fsdp=2"][::order])
        assert train.mesh == MeshConfig(data=2, fsdp=2)
    # new layers, then a block option set on each of them; a layer's other options stay
    attention = apply_overrides(ModelConfig(layers=("mamba2",) * 3),
                                ['layers=["attention", {"type": "attention", "window": 4}]',
                                 "cosine=true"])
    assert attention.layers == (layer("attention", cosine=True),
                                layer("attention", cosine=True, window=4))
    # a value that is not a string is taken as given
    layers = (layer("attention", window=4),)
    assert replace_path(ExperimentConfig("x", ModelConfig(), MQARConfig()), "model.layers",
                        layers).model.layers == layers


@pytest.mark.parametrize(
    "override, message",
    [
        ("steps=7.5", r"cannot parse steps='7.5' as <class 'int'>: invalid literal for int\(\)"),
        ("learning_rate=none", r"cannot parse learning_rate='none' as <class 'float'>"),
        ("async_checkpoint=maybe",
         r"cannot parse async_checkpoint='maybe' as <class 'bool'>: expected true/false, "
         r"got 'maybe'"),
        ('mesh.axis_rule_overrides="embed=none"',
         r"cannot parse axis_rule_overrides=.*: expected a JSON list, got"),
        ('mesh={"dta": 2}', r"MeshConfig: unknown key\(s\) \['dta'\]"),
        # a number for a section was a bare TypeError ('int' object is not iterable)
        ("mesh=2", r"cannot parse mesh='2' as .*: expected a JSON object of MeshConfig's "
                   r"fields, e\.g\. '\{\"data\": \.\.\.\}' \(or one field at a time: "
                   r"mesh\.FIELD=VALUE\), got '2'"),
        ("steps.x=1", r"cannot set \['x'\]: int has no fields"),
        ("=5", r"override '=5' must have the form key=value"),
    ],
)
def test_bad_train_overrides_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_block_options_are_set_only_by_their_own_key():
    with pytest.raises(ValueError, match=r"unknown config key 'cosine' in ModelConfig"):
        apply_overrides(ModelConfig(), ["cosine.x=true"])


def test_layer_specs_are_order_free_and_json_ready():
    assert layer("attention", window=4, num_heads=2) == layer("attention", num_heads=2, window=4)
    assert layer("attention", window=4, num_heads=2).options == (("num_heads", 2), ("window", 4))
    nested = ModelConfig(layers=(layer("parallel", branches=(layer("attention", window=4),
                                                             "ffn")),))
    as_json = json.loads(json.dumps(to_dict(nested)))
    assert as_json["layers"] == [{"type": "parallel",
                                  "branches": [{"type": "attention", "window": 4}, "ffn"]}]
    assert from_dict(ModelConfig, as_json) == nested
    # registered defaults (parallel's layout), then the layer's own options
    assert nested.block_options(0).layout == "parallel"
    sequential = layer("parallel", branches=("attention", "ffn"), layout="sequential")
    assert ModelConfig(layers=(sequential,)).block_options(0).layout == "sequential"


def test_data_configs_round_trip_with_their_own_kind_only():
    data = MQARConfig(num_kv_pairs=2)
    assert from_dict(MQARConfig, to_dict(data)) == data
    with pytest.raises(ValueError, match=r"MQARConfig: kind='text', expected 'mqar'"):
        from_dict(MQARConfig, {**to_dict(data), "kind": "text"})
    with pytest.raises(ValueError, match=r"TrainConfig: unknown key\(s\) \['kind'\]"):
        from_dict(TrainConfig, {"kind": "mqar", "steps": 3})


@dataclasses.dataclass(frozen=True)
class _Tuples:
    values: tuple[int, ...] = ()


def test_from_dict_turns_json_lists_back_into_tuples():
    assert from_dict(_Tuples, to_dict(_Tuples((1, 2)))) == _Tuples((1, 2))


def test_resolved_sizes():
    assert ModelConfig(head_dim=32).resolved_head_dim == 32
    assert ModelConfig().resolved_head_dim == 16
    assert ModelConfig(d_model=100).resolved_ffn_dim == 288  # 8·100/3 = 266, rounded up to 32


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
