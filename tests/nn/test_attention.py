"""Attention mixer against a numpy per-token loop of its equations: GQA, RoPE (partial, at a
non-default base), a sliding window, scaled-cosine attention with per-head temperatures."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.ops import context_parallel
from tests.helpers import assert_close, assert_init_stds, normals
from tests.nn.test_gated_deltanet import jitted_mixer, param, project
from tests.ops.test_attention import numpy_rope


def project_biased(x, linear) -> np.ndarray:
    return project(x, linear) + (0.0 if linear.bias is None else param(linear.bias))


def attention_reference(mixer, x, *, window, theta, fraction, cosine) -> np.ndarray:
    """Causal attention of query t over keys max(0, t − w + 1) .. t, one query at a time, in
    float64: logits q·k/√D, or with `cosine` cos(q, k)·exp(min(τ_h, log 100)); q, k, v with
    their biases when the projections have them."""
    positions = np.arange(x.shape[1])
    q, k = (numpy_rope(project_biased(x, proj), positions, theta, fraction)
            for proj in (mixer.q_proj, mixer.k_proj))
    v = project_biased(x, mixer.v_proj)
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


def test_qkv_biases_are_added_to_q_k_v():
    """Qwen2's biases (set to random values here: they start at zero) shift q and k before
    RoPE and v before the softmax average."""
    cfg = ModelConfig(layers=(layer("attention", num_heads=4, num_kv_heads=2, qkv_bias=True),),
                      vocab_size=8, d_model=16, num_heads=2, init_std=0.5)
    mixer = hj.create_model(cfg).blocks[0].mixer
    for seed, proj in enumerate((mixer.q_proj, mixer.k_proj, mixer.v_proj)):
        proj.bias[...] = jnp.asarray(normals(10 + seed, proj.bias.shape, dtype=np.float32))
    assert mixer.o_proj.bias is None
    x = normals(0, (2, 7, 16), dtype=np.float32)
    expected = attention_reference(mixer, np.asarray(x, np.float64), window=None,
                                   theta=10000.0, fraction=1.0, cosine=False)
    assert_close(mixer(x, TokenContext.create(x.shape[:2])), expected, 2e-6)


def test_projections_start_at_init_std_and_the_output_at_its_residual_scale():
    """q, k, v at `init_std`; W_o, which writes into the residual stream, at
    init_std / √(2·num_layers) (GPT-2): here 0.4 / √6 with three layers."""
    cfg = ModelConfig(layers=("attention",) * 3, vocab_size=8, d_model=64, num_heads=2,
                      init_std=0.4)
    mixer = hj.create_model(cfg).blocks[0].mixer
    assert_init_stds(mixer, {"q_proj": 0.4, "k_proj": 0.4, "v_proj": 0.4,
                             "o_proj": 0.4 / math.sqrt(6)}, rtol=0.05)  # 4096 draws


@pytest.mark.parametrize("options, message", [
    (dict(window=0), r"window=0: attention needs window >= 1 or None"),
    (dict(window=-2), r"window=-2: attention needs window >= 1 or None"),
    (dict(num_heads=4, num_kv_heads=3), r"num_kv_heads=3 does not divide num_heads=4"),
    (dict(num_heads=3), r"num_heads=3 does not divide d_model=16"),
    (dict(rope_fraction=1.5), r"rope_fraction must be in \[0, 1\], got 1.5"),
    (dict(rope_scaling=(8.0, 4.0, 1.0, 8192)),
     r"AttentionOptions.rope_scaling=\(8.0, 4.0, 1.0, 8192\): expected None or \(factor, "),
    # 0 was a ZeroDivisionError (num_heads), or read as unset: silently full multi-head
    # attention, d_model / num_heads wide heads, a temperature of √head_dim.
    (dict(num_heads=0), r"AttentionOptions.num_heads=0: expected a positive integer$"),
    (dict(num_kv_heads=0), r"AttentionOptions.num_kv_heads=0: expected a positive integer or "
                           r"None"),
    (dict(head_dim=0), r"AttentionOptions.head_dim=0: expected a positive integer or None"),
    (dict(cosine=True, temperature_init=0.0), r"AttentionOptions.temperature_init=0.0: "
                                              r"expected a positive number or None"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=r"layers\[0\] \('attention'\): " + message):
        ModelConfig(layers=(layer("attention", **options),), vocab_size=8, d_model=16,
                    num_heads=2)


def test_head_dim_of_its_own_frees_num_heads_from_d_model():
    """With `head_dim` set, 3 heads on d_model 16 are legal (q: 3 × 5 channels), window 1
    sees the token itself only: the output is W_o of each query head's own value."""
    cfg = ModelConfig(layers=(layer("attention", num_heads=3, num_kv_heads=1, head_dim=5,
                                    window=1),),
                      vocab_size=8, d_model=16, num_heads=2)
    mixer = hj.create_model(cfg).blocks[0].mixer
    assert mixer.q_proj.kernel.shape == (16, 3, 5) and mixer.k_proj.kernel.shape == (16, 1, 5)
    x = normals(0, (1, 4, 16), dtype=np.float32)
    v = project(np.asarray(x, np.float64), mixer.v_proj)  # [B, T, 1, 5]
    expected = np.tensordot(np.repeat(v, 3, axis=2), param(mixer.o_proj.kernel), axes=2)
    assert_close(mixer(x, TokenContext.create(x.shape[:2])), expected, 1e-6)


def test_the_op_gets_the_options_and_the_documents(monkeypatch):
    """The parallel pass hands the op its causal mask, window and implementation, and the
    context's segment ids with their extents (computed once per batch, not per layer)."""
    cfg = ModelConfig(layers=(layer("attention", window=3, implementation="reference"),),
                      vocab_size=8, d_model=16, num_heads=2)
    mixer = hj.create_model(cfg).blocks[0].mixer
    calls = []
    attention = context_parallel.attention

    def spy(q, k, v, **kwargs):
        calls.append(kwargs)
        return attention(q, k, v, **kwargs)

    monkeypatch.setattr(context_parallel, "attention", spy)
    ctx = TokenContext.create((1, 6), segment_ids=jnp.asarray([[0, 0, 0, 1, 1, 1]]))
    mixer(normals(0, (1, 6, 16), dtype=np.float32), ctx)
    [kwargs] = calls
    assert (kwargs["causal"], kwargs["window"], kwargs["implementation"]) == (True, 3,
                                                                            "reference")
    assert kwargs["segment_ids"] is ctx.segment_ids
    assert kwargs["segment_extents"] is ctx.segment_extents


@pytest.mark.parametrize("window, max_len, length", [(3, 10, 3), (8, 5, 5), (None, 7, 7)])
def test_cache_holds_the_window_or_max_len_entries(window, max_len, length):
    """A ring of min(window, max_len) entries (no more tokens than max_len can be in a
    window), max_len without a window; empty entries at position −1."""
    cfg = ModelConfig(layers=(layer("attention", num_kv_heads=1, window=window),),
                      vocab_size=8, d_model=16, num_heads=2)
    cache = hj.create_model(cfg).blocks[0].mixer.init_cache(2, max_len, jnp.bfloat16,
                                                             value_dim=5)
    assert cache.keys.shape == (2, length, 1, 8) and cache.values.shape == (2, length, 1, 5)
    assert cache.keys.dtype == cache.values.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(cache.positions), [-1] * length)
