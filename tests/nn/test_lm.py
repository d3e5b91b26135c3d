"""LanguageModel: parallel logits equal prefill + token-by-token decode, for every tiny preset."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from tests.helpers import assert_close


def decode_logits(model, tokens, split, max_len, fresh=False):
    """Prefill `tokens[:, :split]` (`fresh`: as `fresh_cache=True`), then feed the rest one token
    at a time (a scan), in one jit."""

    @jax.jit
    def run(state, tokens):
        model_ = nnx.merge(graphdef, state)
        cache = model_.init_cache(tokens.shape[0], max_len)
        outs = []
        if split:
            logits, cache = model_.decode(tokens[:, :split], cache, fresh_cache=fresh)
            outs.append(logits)

        def step(cache, token_B):
            logits, cache = model_.decode(token_B[:, None], cache)
            return cache, logits[:, 0]

        _, stepped = jax.lax.scan(step, cache, tokens[:, split:].T)
        return jnp.concatenate([*outs, stepped.transpose(1, 0, 2)], axis=1)

    graphdef, state = nnx.split(model)
    return run(state, tokens)


def check_decode_matches(config: ModelConfig, T=12, splits=(0, 5), max_len=None, tol=1e-5,
                         fresh=False):
    model = hj.create_model(config, seed=1)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, T)),
                         jnp.int32)
    graphdef, state = nnx.split(model)
    parallel = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, tokens)
    for split in splits:
        decoded = decode_logits(model, tokens, split, max_len or T, fresh)
        assert_close(decoded, parallel, tol, f"{config.layers[0].type} split={split}")


TINY = [name for name in presets.names() if "tiny" in name]


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_decode_equals_parallel(name):
    check_decode_matches(presets.get(name))


def test_windowed_ring_buffer_wraps():
    """Decoding far past the window: the ring buffer wraps and old keys drop out exactly."""
    cfg = ModelConfig(layers=(layer("attention", window=3), "attention"), vocab_size=32,
                      d_model=16, num_heads=2, num_kv_heads=1)
    check_decode_matches(cfg, T=11, splits=(0, 2, 7))


def test_cosine_partial_rope_untied():
    cfg = ModelConfig(layers=(layer("attention", cosine=True), "attention"), vocab_size=32,
                      d_model=16, num_heads=2, rope_fraction=0.5, tie_embeddings=False)
    check_decode_matches(cfg, T=9, splits=(0, 4))


def test_cache_longer_than_needed():
    check_decode_matches(presets.get("transformer-tiny"), T=6, splits=(3,), max_len=40)


def test_125m_preset_has_gpt2_small_size():
    model = nnx.eval_shape(lambda: hj.LanguageModel(presets.get("transformer-125m"),
                                                    rngs=nnx.Rngs(0)))
    assert 120e6 < hj.count_params(model) < 130e6


def test_bad_tokens_are_named():
    model = hj.create_model(presets.get("transformer-tiny"))
    with pytest.raises(ValueError, match=r"tokens must be an integer array \[batch, time\]"):
        model(jnp.zeros((2, 3, 4), jnp.int32))
    with pytest.raises(ValueError, match="integer array"):
        model(jnp.zeros((2, 3), jnp.float32))
    with pytest.raises(ValueError, match="init_cache needs batch >= 1"):
        model.init_cache(0, 8)


def test_cache_dtype_defaults_to_the_compute_dtype_and_one_position_is_enough():
    model = hj.create_model(presets.get("transformer-tiny").replace(dtype="bfloat16"))

    def float_dtypes(cache):
        return {leaf.dtype.name for leaf in jax.tree.leaves(cache.layers)
                if jnp.issubdtype(leaf.dtype, jnp.floating)}

    assert float_dtypes(model.init_cache(1, 1)) == {"bfloat16"}
    assert float_dtypes(model.init_cache(1, 1, jnp.float32)) == {"float32"}
    logits, cache = model.decode(jnp.asarray([[3]]), model.init_cache(1, 1))
    assert int(cache.index) == 1 and np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("part", ["positions_BT", "segment_ids_BT", "extras"])
def test_a_context_and_its_parts_are_refused_together(part):
    model = hj.create_model(presets.get("transformer-tiny"))
    tokens = jnp.zeros((1, 4), jnp.int32)
    value = {} if part == "extras" else jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="pass either context= or positions_BT / "
                                         "segment_ids_BT / extras, not both"):
        model(tokens, TokenContext.create((1, 4)), **{part: value})


def learned_position_config(**changes):
    return ModelConfig(layers=("mamba1", layer("attention", window=4)), vocab_size=16,
                       d_model=8, num_heads=2, rope_fraction=0.0,
                       position_embedding="learned", max_positions=12, **changes)


def test_learned_positions_are_counted_used_and_decode_exactly():
    """The [max_positions, d_model] table is a parameter, changes the logits of a model
    without RoPE (which alone cannot tell positions apart), and decoding adds the same rows."""
    cfg = learned_position_config()
    model = hj.create_model(cfg, seed=1)
    without = hj.create_model(cfg.replace(position_embedding="none", max_positions=None), seed=1)
    assert model.position_table.shape == (12, 8)
    assert hj.count_params(model) == hj.count_params(without) + 12 * 8
    tokens = jnp.full((1, 6), 3, jnp.int32)  # the same token everywhere
    model.position_table[...] = 0.5 * jax.random.normal(jax.random.key(2), (12, 8))
    logits = model(tokens)
    assert float(jnp.max(jnp.abs(logits - logits[:, :1]))) > 1e-4  # positions tell them apart
    positions = jnp.asarray([[3, 0, 11, 5, 5, 1]])  # packed documents restart them
    expected = model.embed.table[...][tokens] + model.position_table[...][positions]
    assert_close(model._embed(tokens, positions), expected, 1e-7)
    check_decode_matches(cfg, T=12, splits=(0, 5))


def test_a_packed_training_batch_gives_each_document_its_own_logits():
    """`TokenContext.from_batch` takes the batch's positions and segment ids: with learned
    positions (RoPE alone is blind to a shift of every position) each packed document's
    logits are those of the document alone."""
    model = hj.create_model(learned_position_config(), seed=1)
    model.position_table[...] = 0.5 * jax.random.normal(jax.random.key(3), (12, 8))
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 16, (1, 9)), jnp.int32)
    batch = {"inputs": tokens, "segment_ids": jnp.asarray([[1] * 4 + [2] * 5]),
             "positions": jnp.asarray([[0, 1, 2, 3, 0, 1, 2, 3, 4]])}
    packed = model(tokens, TokenContext.from_batch(batch))
    assert_close(packed[:, :4], model(tokens[:, :4]), 1e-5, "first document")
    assert_close(packed[:, 4:], model(tokens[:, 4:]), 1e-5, "second document")


def test_learned_positions_past_the_table_are_errors():
    model = hj.create_model(learned_position_config())
    with pytest.raises(ValueError, match=r"sequence of 13 positions, expected at most "
                                         r"ModelConfig.max_positions=12"):
        model(jnp.zeros((1, 13), jnp.int32))
    with pytest.raises(ValueError, match=r"decode cache of 20 positions, expected at most "
                                         r"ModelConfig.max_positions=12"):
        model.init_cache(1, 20)
    # A packed position past the table reads NaN, never a clamped row (so the loss shows it).
    logits = model(jnp.zeros((1, 2), jnp.int32), positions_BT=jnp.asarray([[0, 12]]))
    assert np.isnan(logits[0, 1]).all()


def test_decode_refuses_a_cache_of_another_models_layers():
    """Checked before any compute (abstract models): each mixer failed on its own, e.g. an
    AttributeError for the `convs` an AttentionCache lacks, or a strict zip's length."""
    def abstract(layers):
        config = ModelConfig(layers=layers, d_model=16, num_heads=2, vocab_size=32)
        return nnx.eval_shape(lambda: hj.LanguageModel(config, rngs=nnx.Rngs(0)))

    model, other = abstract(("attention", "gdn")), abstract(("attention", "attention"))
    tokens = jnp.ones((1, 2), jnp.int32)
    with pytest.raises(ValueError, match=r"the cache's layer 1 is BlockCache\(AttentionCache, "
                                         r"None\), this model's layer 1 \('gdn'\) needs "
                                         r"BlockCache\(GatedDeltaNetCache, None\)"):
        model.decode(tokens, other.init_cache(1, 4))
    cache = model.init_cache(1, 4)
    with pytest.raises(ValueError, match="the cache holds 1 layers, the model has 2"):
        model.decode(tokens, cache.replace(layers=cache.layers[:1]))
