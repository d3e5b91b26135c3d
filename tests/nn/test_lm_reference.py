"""LanguageModel against numpy: the embedding sum, the final RMSNorm, the tied and untied heads,
the initial scales of its own parameters, and the guards of its entry points."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from tests.helpers import assert_close
from tests.nn.test_gated_deltanet import rms


def small_config(**changes):
    return ModelConfig(**{**dict(layers=(layer("attention", window=3), "attention"), vocab_size=16,
                                 d_model=8, num_heads=2, num_kv_heads=1, rope_fraction=0.0,
                                 position_embedding="learned", max_positions=10, norm_eps=0.5),
                          **changes})


@pytest.mark.parametrize("tied", [True, False])
def test_logits_are_the_normed_blocks_output_through_the_head(tied):
    """logits = (h / √(mean h² + eps) · γ) · head, h the blocks' output on
    `E[token] + P[position]`; the head is Eᵀ when tied, else its own `[d_model, vocab]`."""
    model = hj.create_model(small_config(tie_embeddings=tied), seed=1)
    rng = np.random.default_rng(0)
    model.position_table[...] = jnp.asarray(rng.normal(0, 0.5, (10, 8)), jnp.float32)
    model.final_norm.scale[...] = jnp.asarray(rng.uniform(0.5, 2, 8), jnp.float32)
    tokens = jnp.asarray([[3, 0, 15, 7, 7], [1, 2, 3, 4, 5]], jnp.int32)
    positions = jnp.asarray([[0, 1, 2, 0, 1], [5, 6, 7, 8, 9]], jnp.int32)
    context = TokenContext.create((2, 5), positions=positions)

    table, pos = np.asarray(model.embed.table[...]), np.asarray(model.position_table[...])
    x = jnp.asarray(table[np.asarray(tokens)] + pos[np.asarray(positions)])
    assert_close(model._embed(tokens, positions), x, 1e-7, "embedding")
    for block in model.blocks:
        x = block(x, context)
    gamma = np.asarray(model.final_norm.scale[...])
    h = rms(np.asarray(x, np.float64), model.config.norm_eps) * gamma
    head = table.T if tied else np.asarray(model.lm_head.kernel[...])
    assert (model.lm_head is None) == tied and head.shape == (8, 16)
    logits = model(tokens, context)
    assert logits.dtype == jnp.float32 and logits.shape == (2, 5, 16)
    assert_close(logits, h @ head, 1e-5, "logits")


def test_own_parameters_are_drawn_at_init_std_and_differ_by_seed():
    config = small_config(vocab_size=512, d_model=32, max_positions=256, init_std=0.05,
                          tie_embeddings=False)
    model = hj.create_model(config, seed=3)
    for name, value in [("embed", model.embed.table[...]), ("positions", model.position_table[...]),
                        ("lm_head", model.lm_head.kernel[...])]:
        value = np.asarray(value)
        assert value.size >= 8192 and abs(value.std() / 0.05 - 1) < 0.05, (name, value.std())
        assert abs(value.mean()) < 0.005, name
    np.testing.assert_array_equal(model.final_norm.scale[...], np.ones(32))
    other = hj.create_model(config, seed=4)
    assert not np.allclose(model.embed.table[...], other.embed.table[...])
    assert not np.allclose(model.position_table[...], other.position_table[...])


def test_bf16_compute_embeds_in_bf16_from_float32_tables():
    model = hj.create_model(small_config(dtype="bfloat16"), seed=1)
    model.position_table[...] = 0.5 * jax.random.normal(jax.random.key(1), (10, 8))
    assert model.embed.table[...].dtype == model.position_table[...].dtype == jnp.float32
    tokens, positions = jnp.asarray([[1, 9, 4]]), jnp.asarray([[0, 7, 2]])
    x = model._embed(tokens, positions)
    assert x.dtype == jnp.bfloat16
    expected = (model.embed.table[...][tokens].astype(jnp.bfloat16)
                + model.position_table[...][positions].astype(jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(expected, np.float32))
    context = TokenContext.create((1, 3))
    assert model.blocks[0](x, context).dtype == jnp.bfloat16  # projections and norms too
    assert model.final_norm(x).dtype == jnp.bfloat16
    assert model(tokens).dtype == jnp.float32


def test_traced_ids_at_the_vocabulary_edges_are_finite():
    """0 and vocab_size − 1 are ids (only ids outside [0, vocab_size) embed as NaN)."""
    model = hj.create_model(small_config(), seed=1)
    tokens = jnp.asarray([[0, 15, 0], [15, 0, 15]])
    logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    assert np.isfinite(np.asarray(logits)).all()
    assert_close(logits, model(tokens), 1e-6)


def test_entry_points_refuse_1d_tokens_an_empty_cache_and_a_scanned_model():
    model = hj.create_model(small_config(position_embedding="none", max_positions=None))
    for call in (model, lambda t: model.decode(t, model.init_cache(1, 4))):
        with pytest.raises(ValueError, match=r"tokens must be an integer array \[batch, time\], "
                                             r"got shape \(3,\) dtype int32"):
            call(jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match=r"init_cache needs batch >= 1 and max_len >= 1, got "
                                         r"batch=1, max_len=0"):
        model.init_cache(1, 0)
    cache = model.init_cache(1, 4)
    scanned = model.with_scan_layers(True)  # a cache of the unscanned model does not help
    with pytest.raises(ValueError, match="decoding needs ModelConfig.scan_layers=False"):
        scanned.decode(jnp.asarray([[1]]), cache)


def test_stacked_parameters_name_their_group_axis_first_and_unsharded():
    model = hj.create_model(small_config(layers=("attention",) * 2), seed=1)
    scanned = model.with_scan_layers(True)  # period 1, 2 groups

    def axes(variable):
        return variable.get_metadata()["logical_axes"]

    plain = model.blocks[0].mixer.q_proj.kernel
    stacked = scanned.blocks[0].mixer.q_proj.kernel
    assert stacked.shape == (2, *plain.shape) and len(axes(plain)) == plain.ndim
    assert axes(stacked) == (None, *axes(plain))
    assert axes(scanned.blocks[0].mixer_norm.scale) == (None, "norm")
    assert axes(scanned.embed.table) == axes(model.embed.table)  # outside the blocks: as is


def test_remat_policies_keep_less_of_the_blocks_for_the_backward():
    """Residuals of the loss's backward: everything without remat, the dots with
    "dots_saveable", only what the kernels name with "kernels" (the XLA rungs on the CPU name
    none: as "full", the block inputs)."""
    tokens = jnp.asarray([[1, 2, 3, 4]])

    def count(remat):
        model = hj.create_model(ModelConfig(layers=("attention",), vocab_size=16,
                                            d_model=16, num_heads=2, remat=remat))
        graphdef, state = nnx.split(model)
        printed = io.StringIO()  # one line a residual (JAX's public view of them)
        with contextlib.redirect_stdout(printed):
            jax.ad_checkpoint.print_saved_residuals(
                lambda s: jnp.sum(nnx.merge(graphdef, s)(tokens)), state)
        return len(printed.getvalue().splitlines())

    counts = {remat: count(remat) for remat in ("none", "dots_saveable", "kernels", "full")}
    assert counts["none"] > counts["dots_saveable"] > counts["full"], counts
    if jax.default_backend() == "cpu":
        assert counts["kernels"] == counts["full"], counts


def test_count_params_counts_parameters_only():
    class Module(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.zeros((3, 4)))
            self.stat = nnx.BatchStat(jnp.zeros(5))

    assert hj.count_params(Module()) == 12
