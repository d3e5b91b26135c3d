"""Attention mixer against a numpy per-token loop of its equations: GQA, RoPE (partial, at a
non-default base), a sliding window, scaled-cosine attention with per-head temperatures."""

import numpy as np
import pytest

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from tests.helpers import assert_close, normals
from tests.nn.test_gated_deltanet import jitted_mixer, param, project
from tests.ops.test_attention import numpy_rope


def attention_reference(mixer, x, *, window, theta, fraction, cosine) -> np.ndarray:
    """Causal attention of query t over keys max(0, t − w + 1) .. t, one query at a time, in
    float64: logits q·k/√D, or with `cosine` cos(q, k)·exp(min(τ_h, log 100))."""
    positions = np.arange(x.shape[1])
    q, k = (numpy_rope(project(x, proj), positions, theta, fraction)
            for proj in (mixer.q_proj, mixer.k_proj))
    v = project(x, mixer.v_proj)
    heads, kv_heads, dim = q.shape[2], k.shape[2], q.shape[3]
    scale = np.full(heads, dim ** -0.5)
    if cosine:
        q, k = (u / np.linalg.norm(u, axis=-1, keepdims=True) for u in (q, k))
        scale = np.exp(np.minimum(param(mixer.log_temperature), np.log(100.0)))
    out = np.zeros(q.shape[:3] + v.shape[3:])
    for t in range(x.shape[1]):
        first = 0 if window is None else max(0, t - window + 1)
        for h in range(heads):
            g = h * kv_heads // heads
            logits = scale[h] * k[:, first:t + 1, g] @ q[:, t, h][..., None]  # [B, keys, 1]
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            out[:, t, h] = np.sum(p / p.sum(axis=1, keepdims=True) * v[:, first:t + 1, g],
                                  axis=1)
    return np.tensordot(out, param(mixer.o_proj.kernel), axes=2)


@pytest.mark.parametrize("options", [
    dict(num_heads=4, num_kv_heads=2),
    dict(num_heads=4, num_kv_heads=1, window=3, rope_theta=500.0, rope_fraction=0.5),
    dict(num_heads=2, cosine=True, temperature_init=3.0, window=5),
    dict(num_heads=2, cosine=True, temperature_init=150.0),  # clamped at 100
], ids=["gqa", "window-partial-rope", "cosine", "cosine-clamped"])
def test_mixer_matches_numpy_per_token_loop(options):
    """Projections of std 0.5, so that the logits are O(1) and the softmax is not uniform."""
    cfg = ModelConfig(layers=(layer("attention", **options),), vocab_size=8, d_model=16,
                      num_heads=2, init_std=0.5)
    mixer, forward = jitted_mixer(cfg)
    x = normals(0, (2, 11, 16), dtype=np.float32)
    expected = attention_reference(
        mixer, np.asarray(x, np.float64), window=options.get("window"),
        theta=options.get("rope_theta", 10000.0), fraction=options.get("rope_fraction", 1.0),
        cosine=options.get("cosine", False))
    assert_close(forward(x, None), expected, 2e-6)


@pytest.mark.parametrize("head_dim, temperature_init, expected", [
    (16, None, 4.0),  # √head_dim: cos(q, k)·√D has the std of q·k/√D at init
    (9, None, 3.0),
    (16, 2.5, 2.5),
])
def test_cosine_temperature_starts_at_ordinary_attention_scale(head_dim, temperature_init,
                                                                expected):
    cfg = ModelConfig(layers=(layer("attention", num_heads=2, head_dim=head_dim, cosine=True,
                                    temperature_init=temperature_init),),
                      vocab_size=8, d_model=16, num_heads=2)
    mixer = hj.create_model(cfg).blocks[0].mixer
    np.testing.assert_allclose(np.exp(np.asarray(mixer.log_temperature[...])),
                               [expected] * 2, rtol=1e-6)
