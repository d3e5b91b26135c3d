"""A prefill into a fresh cache (`decode(..., fresh_cache=True)`, what `generate` does): the same
logits and cache as the cached form, attention called as in the forward (no explicit positions,
so the fast rungs take it), and refused on a cache that already holds tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.ops import context_parallel
from tests.helpers import assert_close
from tests.nn.test_lm import check_decode_matches

WINDOWED = ModelConfig(layers=(layer("attention", window=3), "attention"), vocab_size=32,
                       d_model=16, num_heads=2, num_kv_heads=1)


@pytest.mark.parametrize("config", [
    WINDOWED, presets.get("pha-tiny"), presets.get("oryx-gdn-tiny")],
    ids=["window-3", "pha-tiny", "oryx-gdn-tiny"])
def test_fresh_prefill_then_steps_equal_the_parallel_forward(config):
    """Prompts past the window (the ring buffer keeps its last 3), cosine attention with its
    temperature (PHA), and Oryx's attention mode."""
    check_decode_matches(config, T=11, splits=(7,), fresh=True)


def _model_and_tokens(length=6):
    model = hj.create_model(WINDOWED, seed=0)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (2, length)), jnp.int32)
    return model, tokens


def test_fresh_prefill_attends_without_positions_and_fills_the_cache_alike(monkeypatch):
    model, tokens = _model_and_tokens()
    calls = []
    attention = context_parallel.attention

    def spy(q, k, v, **kwargs):
        calls.append((k.shape[1], "kv_positions" in kwargs))
        return attention(q, k, v, **kwargs)

    monkeypatch.setattr(context_parallel, "attention", spy)
    fresh_logits, fresh_cache = model.decode(tokens, model.init_cache(2, 9), fresh_cache=True)
    assert calls == [(6, False)] * 2  # each layer: the 6 tokens alone, no positions
    calls.clear()
    logits, cache = model.decode(tokens, model.init_cache(2, 9))
    assert calls == [(9, True), (15, True)]  # window 3 (ring of 3) + 6, max_len 9 + 6
    assert_close(fresh_logits, logits, 1e-6, "logits")
    for a, b in zip(jax.tree.leaves(fresh_cache), jax.tree.leaves(cache), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fresh_cache_is_refused_after_tokens():
    model, tokens = _model_and_tokens()
    _, cache = model.decode(tokens[:, :2], model.init_cache(2, 9))
    with pytest.raises(ValueError, match="fresh_cache=True.*after 2 token"):
        model.decode(tokens[:, 2:], cache, fresh_cache=True)
    # Traced index: NaN, as for an overflow, from the first token held on.
    _, one = model.decode(tokens[:, :1], model.init_cache(2, 9))
    graphdef, state = nnx.split(model)
    logits, _ = jax.jit(lambda s, t, c: nnx.merge(graphdef, s).decode(t, c, fresh_cache=True))(
        state, tokens[:, 1:], one)
    assert np.isnan(np.asarray(logits)).all()
