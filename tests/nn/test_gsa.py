"""Gated Slot Attention block: the layer against a numpy per-token loop of its equations, decode
equals the parallel pass, packed documents are isolated, options are checked."""

import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.nn.gsa import GSAOptions
from tests.helpers import assert_close, normals
from tests.nn.test_gated_deltanet import (
    check_documents_isolated,
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
    non-default logit scale and gate normaliser."""
    cfg = ModelConfig(layers=(layer("gsa", chunk_size=4, num_slots=6, scale=0.5,
                                    gate_logit_normalizer=4.0),),
                      vocab_size=8, d_model=8, num_heads=2)
    mixer, forward = jitted_mixer(cfg)
    x = normals(0, (2, 11, 8), dtype=np.float32)
    expected = gsa_reference(mixer, np.asarray(x, np.float64), cfg.norm_eps, 0.5, 4.0)
    assert_close(forward(x, None), expected, 2e-6)


def test_decode_matches_parallel_across_chunks():
    """A prefill ending mid-chunk, then token-by-token decoding, equals the parallel pass."""
    cfg = ModelConfig(layers=(layer("gsa", chunk_size=4, num_slots=4), "gsa"), vocab_size=32,
                      d_model=16, num_heads=2)
    check_decode_matches(cfg, T=11, splits=(0, 6))


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
