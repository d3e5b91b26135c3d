"""Conversion of an imported transformer into Oryx: in attention mode it is the same model."""

import numpy as np
import pytest
from flax import nnx

from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.convert.oryx import NEW, convert_to_oryx, oryx_config
from hybrid_jax.convert.params import named_values
from hybrid_jax.nn.oryx import MODE
from tests.convert.test_hf import load


def decode_all(model, ids, split, extras):
    cache = model.init_cache(ids.shape[0], ids.shape[1])
    logits, cache = model.decode(ids[:, :split], cache,
                                 extras={k: v[:, :split] for k, v in extras.items()})
    steps = [logits]
    for t in range(split, ids.shape[1]):
        logits, cache = model.decode(ids[:, t:t + 1], cache,
                                     extras={k: v[:, t:t + 1] for k, v in extras.items()})
        steps.append(logits)
    return np.concatenate([np.asarray(s) for s in steps], axis=1)


def test_all_attention_oryx_equals_original_and_only_the_linear_mode_is_new():
    """The Llama fixture (GQA 4/2 heads, Llama-3 RoPE scaling, untied): logits equal with an
    all-attention schedule, in the parallel pass and in prefill + decode; the linear mode
    runs and differs; the new parameters are the linear query and dt / A / D (and convs)."""
    model, ref = load("llama")
    ids = ref["ids"]  # [2, 12]
    original = np.asarray(model(ids))
    converted = convert_to_oryx(model)
    assert {spec.type for spec in converted.config.layers} == {"oryx"}
    attention = {MODE: np.ones(ids.shape, np.int32)}
    scale = np.abs(original).max()
    assert np.abs(np.asarray(converted(ids, extras=attention)) - original).max() <= 1e-5 * scale
    assert np.abs(decode_all(converted, ids, 5, attention) - original).max() <= 1e-5 * scale
    linear = np.asarray(converted(ids, extras={MODE: np.zeros(ids.shape, np.int32)}))
    assert np.isfinite(linear).all() and np.abs(linear - original).max() > 1e-3 * scale
    old = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    new = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(converted, nnx.Param))}
    added = {name.split("/mixer/")[1] for name in new - old}
    assert added == {*(f"attention/{x}_proj/kernel" for x in "qkvo"), "linear/c_proj/kernel", *NEW,
                     *(f"linear/{c}_conv/{p}" for c in "xbc" for p in ("weight", "bias"))}
    mixer, attention = converted.blocks[0].mixer, model.blocks[0].mixer
    assert (np.asarray(mixer.linear.c_proj.kernel[...])
            == np.asarray(attention.q_proj.kernel[...])).all()
    assert (np.asarray(mixer.linear.b_proj.kernel[...])  # kv head h // 2 for query head h
            == np.repeat(np.asarray(attention.k_proj.kernel[...]), 2, axis=1)).all()


def test_convert_refuses_what_oryx_cannot_compute():
    model, _ = load("qwen2")
    with pytest.raises(ValueError, match="qkv_bias=True: Oryx's projections have no biases"):
        convert_to_oryx(model)
    model, _ = load("mistral")
    with pytest.raises(ValueError, match="window=.*full causal attention"):
        convert_to_oryx(model)


def test_seed_draws_the_new_dt_projection():
    """`seed` (0 unless given) draws the new `dt_proj`: another seed, other weights (and the
    default is not seed 1's); the linear query is the attention's whatever the seed."""
    model, _ = load("llama")
    names = ("blocks/0/mixer/linear/dt_proj/kernel", "blocks/0/mixer/linear/c_proj/kernel")
    (dt_default, c_default), (dt_1, c_1) = (
        [np.asarray(named_values(converted)[n]) for n in names]
        for converted in (convert_to_oryx(model), convert_to_oryx(model, seed=1)))
    assert not np.allclose(dt_default, dt_1)
    q_proj = np.asarray(named_values(model)["blocks/0/mixer/q_proj/kernel"])
    np.testing.assert_array_equal(c_default, q_proj)
    np.testing.assert_array_equal(c_1, q_proj)


def two_attention_layers(**layer0) -> ModelConfig:
    """Two attention layers; layer 0 with options of its own (unlike the model-level defaults,
    which the fixtures' layers use, so a dropped option would not show there)."""
    return ModelConfig(layers=(layer("attention", **layer0), "attention"), vocab_size=32,
                       d_model=16, num_heads=4, ffn_dim=32)


def test_attention_mode_takes_each_layers_own_options():
    """Layer 0 (2 heads of 16, its own RoPE) and layer 1 (the model's 4 heads of 4): each
    Oryx layer's attention mode has its attention layer's heads, head size and RoPE, and
    Mamba-2's expand is heads · head_dim / d_model."""
    rope = dict(rope_theta=500.0, rope_fraction=0.5, rope_scaling=(8.0, 1.0, 4.0, 64.0))
    config = two_attention_layers(num_heads=2, num_kv_heads=1, head_dim=16, **rope)
    converted = oryx_config(config)
    for i, expand in ((0, 2), (1, 1)):
        before = config.block_options(i)
        after = converted.block_options(i)
        attention = after.attention_options()
        assert (attention.num_heads, attention.head_dim) == (before.num_heads,
                                                             before.head_dim or 4)
        assert {k: getattr(attention, k) for k in rope} == {k: getattr(before, k) for k in rope}
        assert after.expand == expand and after.ssm_head_dim == after.state_size
    assert converted.block_options(0).attention_options().rope_theta == 500.0


@pytest.mark.parametrize("options, message", [
    (dict(cosine=True), "layer 0 has cosine=True: Oryx's attention mode is softmax"),
    (dict(num_heads=3, head_dim=4), "heads × head_dim = 12 is not a multiple of d_model=16"),
])
def test_convert_refuses_layers_mamba2_cannot_take(options, message):
    with pytest.raises(ValueError, match=message):
        oryx_config(two_attention_layers(**options))
