"""Gated Slot Attention block: the layer against a numpy per-token loop of its equations, decode
equals the parallel pass, packed documents are isolated, options are checked."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.nn.gsa import GSAOptions
from tests.helpers import assert_close, assert_init_stds, normals
from tests.nn.test_gated_deltanet import (
    check_documents_isolated,
    check_prefill_in_pieces,
    finite_mixer,
    jitted_mixer,
    param,
    project,
    rms,
    silu,
)
from tests.nn.test_lm import check_decode_matches


def gsa_reference(mixer, x, eps, scale, tau) -> np.ndarray:
    """The GSA layer (module docstring) token by token in float64 numpy."""
    q, k, v = (silu(project(x, p)) for p in (mixer.q_proj, mixer.k_proj, mixer.v_proj))
    g = -np.logaddexp(0.0, -project(x, mixer.f_proj)) / tau  # logsigmoid / τ, [B, T, H, M]
    s = 1.0 - np.exp(g)
    slot_keys = np.zeros(k.shape[:1] + k.shape[2:] + g.shape[-1:])  # [B, H, K, M]
    slot_values = np.zeros(g.shape[:1] + g.shape[2:] + v.shape[-1:])  # [B, H, M, V]
    out = np.zeros(v.shape)
    for t in range(x.shape[1]):
        forget = np.exp(g[:, t])
        slot_keys = slot_keys * forget[:, :, None] + k[:, t, :, :, None] * s[:, t, :, None]
        slot_values = forget[..., None] * slot_values + s[:, t, :, :, None] * v[:, t, :, None]
        logits = scale * np.einsum("bhkm,bhk->bhm", slot_keys, q[:, t])
        p = np.exp(logits - logits.max(-1, keepdims=True))
        out[:, t] = np.einsum("bhmv,bhm->bhv", slot_values, p / p.sum(-1, keepdims=True))
    normed = rms(silu(out).reshape(*out.shape[:2], -1), eps) * param(mixer.o_norm.scale)
    return np.tensordot(normed.reshape(out.shape), param(mixer.o_proj.kernel), axes=2)


def test_layer_matches_numpy_per_token_loop():
    """Chunked forward (chunk 4, T = 11: a partial last chunk) against the equations, with a
    non-default logit scale and gate normaliser. Projections of std 0.5: at the default
    0.02 the slot logits are ~1e-4, the softmax uniform, and a scale of 1 instead of 0.5
    moved the output by 4e-8 (a mutation passed)."""
    cfg = ModelConfig(layers=(layer("gsa", chunk_size=4, num_slots=6, scale=0.5,
                                    gate_logit_normalizer=4.0),),
                      vocab_size=8, d_model=8, num_heads=2, init_std=0.5)
    mixer, forward = jitted_mixer(cfg)
    x = normals(0, (2, 11, 8), dtype=np.float32)
    expected = gsa_reference(mixer, np.asarray(x, np.float64), cfg.norm_eps, 0.5, 4.0)
    assert_close(forward(x, None), expected, 2e-6)


def test_decode_matches_parallel_across_chunks():
    """A prefill ending mid-chunk, then token-by-token decoding, equals the parallel pass."""
    cfg = ModelConfig(layers=(layer("gsa", chunk_size=4, num_slots=4), "gsa"), vocab_size=32,
                      d_model=16, num_heads=2)
    check_decode_matches(cfg, T=11, splits=(0, 6))


def test_decode_keeps_the_options_of_the_parallel_pass():
    """Single steps and prefills in pieces (the later ones continuing the slots through the
    chunked form) at a logit scale and gate normaliser of their own, as the parallel pass."""
    cfg = ModelConfig(layers=(layer("gsa", chunk_size=4, num_slots=4, scale=0.5,
                                    gate_logit_normalizer=2.0),) * 2,
                      vocab_size=32, d_model=16, num_heads=2, init_std=0.5)
    check_decode_matches(cfg, T=9, splits=(0, 5))
    check_prefill_in_pieces(cfg)


def test_head_dim_and_norm_eps_of_their_own():
    """An explicit head size frees num_heads from d_model (3 heads of 4 on d_model 8); the
    output norm takes the model's `norm_eps` (1e-1: large enough to move the output)."""
    cfg = ModelConfig(layers=(layer("gsa", num_heads=3, head_dim=4, chunk_size=4,
                                    num_slots=3),),
                      vocab_size=8, d_model=8, num_heads=2, norm_eps=1e-1)
    mixer, forward = jitted_mixer(cfg)
    assert mixer.q_proj.kernel.shape == (8, 3, 4) and mixer.o_norm.scale.shape == (12,)
    x = normals(2, (2, 7, 8), dtype=np.float32)
    expected = gsa_reference(mixer, np.asarray(x, np.float64), 1e-1, 1.0, 8.0)
    assert_close(forward(x, None), expected, 2e-6)


def test_projections_start_at_init_std_and_the_output_at_its_residual_scale():
    """q, k, v, f at `init_std`; W_o, which writes into the residual stream, at
    init_std / √(2·num_layers) (GPT-2): here 0.4 / √4 with two layers. The slot cache stays
    float32 whatever the cache dtype."""
    cfg = ModelConfig(layers=(layer("gsa", num_slots=8),) * 2, vocab_size=8, d_model=64,
                      num_heads=2, init_std=0.4)
    mixer = hj.create_model(cfg).blocks[0].mixer
    stds = dict.fromkeys(("q_proj", "k_proj", "v_proj", "f_proj"), 0.4)
    assert_init_stds(mixer, {**stds, "o_proj": 0.2}, rtol=0.1)  # ≥ 1024 draws
    cache = mixer.init_cache(2, 9, jnp.bfloat16)
    assert (cache.slot_keys.shape, cache.slot_values.shape) == ((2, 2, 32, 8), (2, 2, 8, 32))
    assert cache.slot_keys.dtype == cache.slot_values.dtype == jnp.float32


def test_packed_documents_are_isolated():
    """The second document starts mid-chunk; its slots start empty."""
    check_documents_isolated(ModelConfig(layers=(layer("gsa", chunk_size=4, num_slots=4),),
                                         vocab_size=8, d_model=16, num_heads=2))


def test_parameter_count_follows_the_equations():
    d, h, k, m = 16, 2, 8, 5
    cfg = ModelConfig(layers=(layer("gsa", num_slots=m),), vocab_size=10, d_model=d,
                      num_heads=h, ffn_dim=0)
    model = nnx.eval_shape(lambda: hj.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    mixer = 3 * d * h * k + d * h * m + h * k + h * k * d  # q, k, v, f, o_norm, o_proj
    assert hj.count_params(model) == 10 * d + d + mixer + d  # embeddings, norms, mixer


@pytest.mark.parametrize("options, message", [
    (dict(num_slots=0), "num_slots=0: expected a positive integer"),
    (dict(chunk_size=24), "chunk_size=24: expected a power of two"),
    (dict(num_heads=3), "num_heads=3 does not divide d_model=16"),
    (dict(scale=0.0), "scale=0.0: expected a positive number"),
    (dict(gate_logit_normalizer=-8), "gate_logit_normalizer=-8: expected a positive number"),
    (dict(head_dim=0), "head_dim=0: expected a positive integer or None"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(layers=(layer("gsa", **options),), d_model=16, num_heads=2)


def test_smallest_options_are_accepted_and_defaults_are_fla():
    """Sizes of 1 (an explicit head size, one slot, one-token chunks) build a layer whose
    output is finite; the defaults are fla's layer's (64 slots, τ 8, logit scale 1)."""
    mixer = finite_mixer(layer("gsa", num_heads=16, head_dim=1, num_slots=1, chunk_size=1))
    assert mixer.f_proj.kernel.shape == (16, 16, 1)
    defaults = GSAOptions()
    assert (defaults.num_slots, defaults.gate_logit_normalizer, defaults.scale) == (64, 8.0, 1.0)
