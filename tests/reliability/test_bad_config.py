"""Bad configs and overrides: each raises ValueError naming the field, what is allowed and what
was found (Python API and `--set`), before anything is built."""

import math

import jax.numpy as jnp
import pytest

from hybrid_jax.config import (
    ExperimentConfig,
    MeshConfig,
    ModelConfig,
    ModeSchedule,
    TrainConfig,
    apply_overrides,
    from_dict,
    layer,
)
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.text import TextConfig

TRAIN_CASES = [
    (dict(steps=0), r"TrainConfig.steps=0: expected a positive integer"),
    (dict(steps=1.5), r"TrainConfig.steps=1.5: expected an integer"),
    (dict(batch_size=-4), r"TrainConfig.batch_size=-4: expected a positive integer"),
    (dict(learning_rate=0.0), r"TrainConfig.learning_rate=0.0: expected a finite value in \(0"),
    (dict(learning_rate=math.nan), r"TrainConfig.learning_rate=nan"),
    (dict(learning_rate="1e-3"), r"TrainConfig.learning_rate='1e-3': expected a number"),
    (dict(warmup_steps=2000), r"TrainConfig.warmup_steps=2000: expected <= steps=1000"),
    (dict(min_lr_ratio=2.0), r"TrainConfig.min_lr_ratio=2.0: expected a finite value in \[0"),
    (dict(weight_decay=-0.1), r"TrainConfig.weight_decay=-0.1"),
    (dict(beta1=1.0), r"TrainConfig.beta1=1.0: expected a finite value in \[0.0, 1.0\)"),
    (dict(beta2=-0.5), r"TrainConfig.beta2=-0.5"),
    (dict(grad_clip=-1.0), r"TrainConfig.grad_clip=-1.0: expected None \(no clipping\) or"),
    (dict(grad_clip=0.0), r"TrainConfig.grad_clip=0.0: expected None \(no clipping\) or"),
    (dict(keep_checkpoints=0), r"TrainConfig.keep_checkpoints=0: expected >= 1"),
    (dict(batch_size=12, grad_accum=5),
     r"TrainConfig.grad_accum=5: expected a divisor of batch_size=12"),
    (dict(peak_tflops=-1.0), r"TrainConfig.peak_tflops=-1.0: expected a finite value in \[0"),
    (dict(peak_tflops=math.nan), r"TrainConfig.peak_tflops=nan: expected a finite value in \[0"),
    (dict(prefetch=-1), r"TrainConfig.prefetch=-1: expected >= 0"),
    # each field named with its own value (this said prefetch=-2.0)
    (dict(prefetch=-1, peak_tflops=-2.0), r"TrainConfig.prefetch=-1: expected >= 0"),
    (dict(learning_rate=True), r"TrainConfig.learning_rate=True: expected a number"),
    (dict(learning_rate=math.inf), r"TrainConfig.learning_rate=inf: expected a finite value"),
    (dict(grad_clip=math.inf), r"TrainConfig.grad_clip=inf: expected None \(no clipping\) or"),
    (dict(grad_accum=0), r"TrainConfig.grad_accum=0: expected a positive integer"),
    (dict(warmup_steps=-1), r"TrainConfig.warmup_steps=-1: expected an integer >= 0"),
    (dict(log_every=-1), r"TrainConfig.log_every=-1: expected a positive integer"),
    # 0 logged every step (it reads like eval_every=0, "only at the end")
    (dict(log_every=0), r"TrainConfig.log_every=0: expected a positive integer"),
    (dict(eval_every=-1), r"TrainConfig.eval_every=-1: expected an integer >= 0"),
    (dict(checkpoint_every=-1), r"TrainConfig.checkpoint_every=-1: expected an integer >= 0"),
    (dict(freeze=3), r"TrainConfig.freeze=3: expected a string"),
    (dict(freeze="(ffn"), r"TrainConfig.freeze='\(ffn': expected a regular expression \(missing"),
    (dict(mode_schedule="linear"),
     r"TrainConfig.mode_schedule='linear': expected a ModeSchedule"),
    (dict(on_nonfinite="ignore"), r"TrainConfig.on_nonfinite='ignore': expected 'stop' or"),
    (dict(seed=-1), r"TrainConfig.seed=-1: expected an integer >= 0"),
    (dict(eval_batches=-1), r"TrainConfig.eval_batches=-1: expected an integer >= 0"),
    (dict(log_every=True), r"TrainConfig.log_every=True: expected an integer"),
    (dict(stop_grace_s=0), r"TrainConfig.stop_grace_s=0: expected a finite value in \(0"),
    (dict(time_limit_s=-1.0), r"TrainConfig.time_limit_s=-1.0: expected a finite value in \[0"),
    (dict(async_checkpoint="yes"), r"TrainConfig.async_checkpoint='yes': expected true or"),
    (dict(mesh=(1, 1, 1)), r"TrainConfig.mesh=\(1, 1, 1\): expected a MeshConfig"),
]


@pytest.mark.parametrize("kwargs, message", TRAIN_CASES)
def test_train_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


MODEL_CASES = [
    (dict(vocab_size=0), r"ModelConfig.vocab_size=0: expected a positive integer"),
    (dict(vocab_size=2.5), r"ModelConfig.vocab_size=2.5: expected an integer"),
    (dict(d_model=True), r"ModelConfig.d_model=True: expected an integer"),
    (dict(norm_eps=0.0), r"ModelConfig.norm_eps=0.0: expected a finite value in \(0"),
    (dict(norm_eps=1.5), r"ModelConfig.norm_eps=1.5: expected a finite value in \(0"),
    (dict(init_std=-0.02), r"ModelConfig.init_std=-0.02"),
    (dict(rope_theta=0.0), r"ModelConfig.rope_theta=0.0"),
    (dict(layers="attention"), r"ModelConfig.layers='attention': expected a tuple"),
    (dict(tie_embeddings="false"), r"ModelConfig.tie_embeddings='false': expected true or"),
    (dict(head_dim=0), r"ModelConfig.head_dim=0: expected a positive integer or None"),
    (dict(ffn_dim=-1), r"ModelConfig.ffn_dim=-1"),
    (dict(layers=(layer("attention", window="8"),)),
     r"layers\[0\] \('attention'\): AttentionOptions.window='8': expected an integer or None"),
    (dict(layers=(layer("gdn", chunk_size=2.5),)),
     r"layers\[0\] \('gdn'\): GatedDeltaNetOptions.chunk_size=2.5: expected an integer"),
    (dict(rope_scaling=(8.0, 1.0, 4.0)), r"ModelConfig.rope_scaling=\(8.0, 1.0, 4.0\): expected "
     r"None or \(factor, low_freq_factor, high_freq_factor, original_max_positions\)"),
    (dict(num_heads=4, num_kv_heads=3), r"ModelConfig.num_kv_heads=3 does not divide num_heads=4"),
    (dict(num_heads=4, num_kv_heads=0), r"ModelConfig.num_kv_heads=0 does not divide"),
    (dict(window=-1), r"ModelConfig.window=-1: expected None \(full causal\) or an integer >= 0"),
    (dict(num_heads=0), r"ModelConfig.num_heads=0: expected a positive integer"),
    (dict(position_embedding="learned", max_positions=0),
     r"ModelConfig.max_positions=0: expected a positive integer with position_embedding="),
    (dict(init_std=0.0), r"ModelConfig.init_std=0.0: expected a finite value in \(0"),
    (dict(param_dtype="int8"), r"ModelConfig.param_dtype='int8': expected one of \['float32'"),
    (dict(remat="all"),
     r"ModelConfig.remat='all': expected one of \['none', 'full', 'dots_saveable', 'kernels'\]"),
    # rope_frequencies divides by each of these: refused here, not traced into NaNs
    (dict(rope_scaling=5), r"ModelConfig.rope_scaling=5: expected None or \(factor, "),
    (dict(rope_scaling="abcd"), r"ModelConfig.rope_scaling='abcd': expected None or"),
    (dict(rope_scaling=(8.0, 4.0, 1.0, 8192)), r"ModelConfig.rope_scaling=\(8.0, 4.0, 1.0, 8192\): "
     r"expected None or \(.*\): finite numbers with factor > 0, 0 < low_freq_factor < "
     r"high_freq_factor and original_max_positions > 0"),
    (dict(rope_scaling=(8.0, 2.0, 2.0, 8192)), r"ModelConfig.rope_scaling=\(8.0, 2.0, 2.0, 8192\)"),
    (dict(rope_scaling=(0.0, 1.0, 4.0, 8192)), r"ModelConfig.rope_scaling=\(0.0, 1.0, 4.0, 8192\)"),
    (dict(rope_scaling=(8.0, 0.0, 4.0, 8192)), r"ModelConfig.rope_scaling=\(8.0, 0.0, 4.0, 8192\)"),
    (dict(rope_scaling=(8.0, 1.0, 4.0, 0)), r"ModelConfig.rope_scaling=\(8.0, 1.0, 4.0, 0\)"),
    (dict(rope_scaling=[8.0, 1.0, math.inf, 8192]),
     r"ModelConfig.rope_scaling=\(8.0, 1.0, inf, 8192\)"),
    (dict(rope_scaling=(8.0, "1", 4.0, 8192)), r"ModelConfig.rope_scaling=\(8.0, '1', 4.0, 8192\)"),
]


def test_the_other_configs_take_their_smallest_legal_values():
    train = TrainConfig(steps=1, warmup_steps=0, batch_size=1, grad_accum=1, prefetch=0,
                        min_lr_ratio=0.0, weight_decay=0.0, eval_batches=0)
    assert (train.prefetch, train.grad_accum) == (0, 1)
    assert MeshConfig(data=-1, fsdp=1, seq=1, tensor=1).sizes() == (-1, 1, 1, 1)
    with pytest.raises(ValueError, match=r"MeshConfig\(data=-2, .*expected positive sizes"):
        MeshConfig(data=-2)
    assert MQARConfig(num_train_examples=1, num_eval_examples=1).num_train_examples == 1


def test_mesh_shapes_use_every_device_or_refuse():
    """-1 takes the devices the other axes leave; a size that does not divide them, or more
    devices than there are, is refused (never a mesh silently using fewer devices)."""
    assert MeshConfig(fsdp=2).shape(8) == (4, 2, 1, 1)
    with pytest.raises(ValueError, match="3 does not divide the 8 available devices"):
        MeshConfig(fsdp=3).shape(8)
    with pytest.raises(ValueError, match=r"needs 16 devices, only 8 are available"):
        MeshConfig(data=4, fsdp=4).shape(8)
    # ... and says what to do: smaller axes, or fake CPU devices (it said neither)
    with pytest.raises(ValueError, match=r"available: lower train\.mesh\.data / fsdp / seq / "
                                         r"tensor, or, on a CPU, set XLA_FLAGS=--xla_force_host_"
                                         r"platform_device_count=8 before starting"):
        MeshConfig(data=2, seq=4).shape(1)
    assert MeshConfig(data=2, fsdp=2).shape(4) == (2, 2, 1, 1)
    # More devices than there are beside a -1 axis (the default data=-1): it said that 16 does
    # not divide the 8 devices, without the way out.
    with pytest.raises(ValueError, match=r"MeshConfig \[-1, 1, 16, 1\] needs 16 devices, only 8 "
                                         r"are available: lower"):
        MeshConfig(seq=16).shape(8)
    with pytest.raises(ValueError, match=r"MeshConfig \[2, 2, 1, 1\] needs 4 devices, only 3"):
        MeshConfig(data=2, fsdp=2).shape(3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(pattern="chunks"), r"ModeSchedule.pattern='chunks': expected one of \['none'"),
    (dict(chunk=0), r"ModeSchedule.chunk=0: expected a positive integer"),
    (dict(attention_prob=1.5), r"ModeSchedule.attention_prob=1.5: expected a finite value"),
    (dict(chunk=2.5), r"ModeSchedule.chunk=2.5: expected an integer")])
def test_mode_schedule(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModeSchedule(**kwargs)


def test_closed_upper_bounds_take_their_largest_values():
    assert ModeSchedule(pattern="random_chunks", attention_prob=1.0).attention_prob == 1.0
    assert ModelConfig(norm_eps=1.0, rope_fraction=1.0).norm_eps == 1.0
    train = TrainConfig(min_lr_ratio=1.0, warmup_steps=1000, steps=1000)
    assert (train.min_lr_ratio, train.warmup_steps) == (1.0, 1000)


def test_unknown_config_keys_are_named_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"TrainConfig: unknown key\(s\) \['stepz'\]; "
                                         r"allowed: \['steps', 'batch_size'"):
        from_dict(TrainConfig, {"stepz": 3})


def test_model_config_takes_the_smallest_legal_values():
    """Each bound is inclusive: one of everything, multi-query heads, window 0 (NHA's slots
    alone, i.e. GSA), no FFN."""
    config = ModelConfig(layers=("nha",), vocab_size=1, d_model=1, num_heads=1,
                         num_kv_heads=1, head_dim=1, window=0, ffn_dim=0, rope_fraction=0.0,
                         rope_scaling=[8.0, 1.0, 4.0, 8192])
    assert (config.kv_heads, config.window, config.rope_scaling) == (1, 0, (8.0, 1.0, 4.0, 8192))
    assert config.resolved_ffn_dim == 0  # no FFN, not the default width


@pytest.mark.parametrize("kwargs, message", MODEL_CASES)
def test_model_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


DATA_CASES = [
    (MQARConfig, dict(vocab_size=0), r"MQARConfig.vocab_size=0: expected a positive integer"),
    (MQARConfig, dict(seq_len="64"), r"MQARConfig.seq_len='64': expected an integer"),
    (MQARConfig, dict(seq_len=7), r"MQARConfig.seq_len=7: expected an even length"),
    (MQARConfig, dict(num_kv_pairs=0), r"MQARConfig.num_kv_pairs=0"),
    (MQARConfig, dict(power_a=2.0), r"MQARConfig.power_a=2.0: expected a value in \(0, 1\]"),
    (MQARConfig, dict(num_train_examples=0), r"MQARConfig.num_train_examples=0"),
    (MQARConfig, dict(num_eval_examples=0),
     r"MQARConfig.num_eval_examples=0: expected a positive integer"),
    (TextConfig, dict(seq_len=0), r"TextConfig.seq_len=0: expected a positive integer"),
    (TextConfig, dict(tokenizer="bpe:lots"), r"TextConfig.tokenizer='bpe:lots': expected"),
    (TextConfig, dict(tokenizer="bpe:257"), r"TextConfig.tokenizer='bpe:257': a byte-level "
                                            r"BPE needs a vocabulary of at least 258"),
    (TextConfig, dict(encoding="klingon"), r"TextConfig.encoding='klingon': not a known"),
    (TextConfig, dict(token_dtype="float32"), r"TextConfig.token_dtype='float32'"),
    (TextConfig, dict(document_regex="(unclosed"), r"TextConfig.document_regex='\(unclosed'"),
    (TextConfig, dict(word_perplexity=1), r"TextConfig.word_perplexity=1: expected true or"),
]


@pytest.mark.parametrize("cls, kwargs, message", DATA_CASES)
def test_data_config(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_mesh_and_experiment_configs():
    with pytest.raises(ValueError, match=r"MeshConfig.data='2': expected an integer"):
        MeshConfig(data="2")
    with pytest.raises(ValueError, match=r"ExperimentConfig.model=\{\}: expected a ModelConfig"):
        ExperimentConfig(name="x", model={}, data=MQARConfig())
    with pytest.raises(ValueError, match=r"ExperimentConfig.data=.*expected a registered data"):
        ExperimentConfig(name="x", model=ModelConfig(), data={"kind": "mqar"})
    with pytest.raises(ValueError, match=r"ExperimentConfig.train=\{\}: expected a TrainConfig"):
        ExperimentConfig(name="x", model=ModelConfig(), data=MQARConfig(), train={})
    with pytest.raises(ValueError, match=r"ExperimentConfig.name=3: expected a string"):
        ExperimentConfig(name=3, model=ModelConfig(), data=MQARConfig())
    with pytest.raises(ValueError, match=r"MeshConfig\(data=-1, fsdp=1, seq=1, tensor=0\): "
                                         r"expected positive sizes"):
        MeshConfig(tensor=0)
    # a string is one override, not one per character
    with pytest.raises(ValueError, match=r"MeshConfig.axis_rule_overrides='embed=none': "
                                         r"expected a tuple of 'logical=mesh axes' strings"):
        MeshConfig(axis_rule_overrides="embed=none")
    with pytest.raises(ValueError, match=r"MeshConfig.axis_rule_overrides=\(1,\): expected"):
        MeshConfig(axis_rule_overrides=(1,))
    assert MeshConfig(axis_rule_overrides=["embed=none"]).axis_rule_overrides == ("embed=none",)


OVERRIDE_CASES = [
    ("train.grad_clip=-1", r"TrainConfig.grad_clip=-1.0: expected None \(no clipping\)"),
    ("train.learning_rate=-3e-4", r"TrainConfig.learning_rate=-0.0003"),
    ("train.steps=ten", r"cannot parse steps='ten'"),
    ("train.beta2=1", r"TrainConfig.beta2=1"),
    ("data.encoding=utf-99", r"TextConfig.encoding='utf-99'"),
    ("model.vocab_size=-1", r"ModelConfig.vocab_size=-1"),
]


@pytest.mark.parametrize("override, message", OVERRIDE_CASES)
def test_overrides(override, message):
    experiment = ExperimentConfig(name="x", model=ModelConfig(), data=TextConfig(),
                                  train=TrainConfig(steps=10, warmup_steps=1))
    with pytest.raises(ValueError, match=message):
        apply_overrides(experiment, [override])


def test_none_disables_gradient_clipping():
    from hybrid_jax.train.optimizer import make_optimizer

    params = {"w": jnp.ones((2, 2))}
    # The chain is (clip,) adamw, freeze mask: clipping adds exactly one transform.
    unclipped = make_optimizer(TrainConfig(grad_clip=None), scan_layers=False).init(params)
    clipped = make_optimizer(TrainConfig(grad_clip=1.0), scan_layers=False).init(params)
    assert len(clipped) == len(unclipped) + 1 == 3


def test_lm_experiments_find_shared_data_from_the_project_root(tmp_path, monkeypatch):
    from pathlib import Path

    from experiments import registry

    monkeypatch.chdir(tmp_path)  # not the project root
    root = Path(__file__).resolve().parents[2]
    path = Path(registry.get("lm-wikitext2-transformer-tiny").data.path)
    assert path == (root.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.train.raw")
