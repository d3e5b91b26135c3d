"""Scanned layers and remat policies give the same logits and gradients as the plain loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import presets
from hybrid_jax.config import layer
from hybrid_jax.nn.lm import LanguageModel, layer_period
from tests.helpers import assert_close


def test_layer_period():
    assert layer_period(("a", "b") * 3) == 2
    assert layer_period(("a",) * 5) == 1
    assert layer_period(("a", "b", "a")) == 3


@pytest.mark.parametrize("remat", ["none", "dots_saveable", "kernels"])
def test_scanned_equals_loop(remat):
    config = presets.get("transformer-tiny")  # period 2 (full, windowed), 2 groups
    config = config.replace(layers=(layer("attention"), layer("attention", window=4)) * 2,
                            remat=remat)
    plain = LanguageModel(config, rngs=nnx.Rngs(0))
    scanned = plain.with_scan_layers(True)  # the same values, stacked per group member
    assert scanned.config.scan_layers and scanned.blocks[1].mixer.q_proj.kernel.shape[0] == 2
    again = scanned.with_scan_layers(False)
    for (_, a), (_, b) in zip(nnx.to_flat_state(nnx.state(plain)),
                              nnx.to_flat_state(nnx.state(again)), strict=True):
        np.testing.assert_array_equal(a.get_value(), b.get_value())
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 256, (2, 21)))
    segments = jnp.asarray([[0] * 8 + [1] * 13, [0] * 21])

    def loss(model):
        logits = model(tokens, segment_ids_BT=segments)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

    value_and_grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))  # not one compile per op
    (_, plain_logits), plain_grads = value_and_grad(plain)
    (_, logits), grads = value_and_grad(scanned)
    assert_close(logits, plain_logits, 1e-5, "logits")
    plain_norm = sum(float(jnp.sum(g ** 2)) for g in jax.tree.leaves(plain_grads))
    norm = sum(float(jnp.sum(g ** 2)) for g in jax.tree.leaves(grads))
    assert abs(norm - plain_norm) < 1e-5 * plain_norm


def test_scanned_model_refuses_decoding():
    model = LanguageModel(presets.get("transformer-tiny").replace(scan_layers=True),
                          rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="scan_layers=False"):
        model.init_cache(1, 8)
