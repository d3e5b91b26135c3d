"""Conversion of an imported transformer into Oryx: in attention mode it is the same model."""

import numpy as np
import pytest
from flax import nnx

from hybrid_jax.convert.oryx import NEW, convert_to_oryx
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
