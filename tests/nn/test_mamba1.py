"""Mamba-1 block: the mixer against a numpy per-token loop of its equations, decode equals the
parallel pass, packing resets the state, options are checked."""

import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from tests.helpers import assert_close, assert_packed_documents_isolated, normals
from tests.nn.test_gated_deltanet import jitted_mixer, param, project, short_conv, silu, softplus
from tests.nn.test_lm import check_decode_matches


def mamba1_reference(mixer, u) -> np.ndarray:
    """The Mamba-1 mixer (module docstring) token by token in float64 numpy, one document."""
    x = short_conv(project(u, mixer.x_proj), mixer.conv)  # [B, T, E]
    dt = softplus(project(x, mixer.dt_low) @ param(mixer.dt_proj) + param(mixer.dt_bias))
    B, C = project(x, mixer.b_proj), project(x, mixer.c_proj)  # [B, T, N]
    A = -np.exp(param(mixer.A_log))  # [E, N]
    state = np.zeros(x.shape[:1] + A.shape)
    y = np.zeros(x.shape)
    for t in range(u.shape[1]):
        state = (np.exp(dt[:, t, :, None] * A) * state
                 + (dt[:, t] * x[:, t])[:, :, None] * B[:, t, None, :])
        y[:, t] = np.einsum("ben,bn->be", state, C[:, t]) + param(mixer.D) * x[:, t]
    return project(y * silu(project(u, mixer.z_proj)), mixer.out_proj)


def test_mixer_matches_numpy_per_token_loop():
    """Chunked scan (chunk 4, T = 11) against the equations, dt rank 2; projections of std
    0.5 so that the state's part of the output is large."""
    cfg = ModelConfig(layers=(layer("mamba1", state_size=4, chunk_size=4, dt_rank=2),),
                      vocab_size=8, d_model=8, num_heads=2, ffn_dim=0, init_std=0.5)
    mixer, forward = jitted_mixer(cfg)
    u = normals(0, (2, 11, 8), dtype=np.float32)
    assert_close(forward(u, None), mamba1_reference(mixer, np.asarray(u, np.float64)), 2e-6)


def test_mamba1_decode_matches_parallel():
    cfg = ModelConfig(layers=(layer("mamba1", state_size=4, chunk_size=4), "mamba1"),
                      vocab_size=32, d_model=16, num_heads=2, ffn_dim=0)
    check_decode_matches(cfg, T=11, splits=(0, 6))


def test_hybrid_with_windowed_attention_decodes():
    cfg = ModelConfig(layers=(layer("mamba1", state_size=4), layer("attention", window=3)),
                      vocab_size=32, d_model=16, num_heads=2)
    check_decode_matches(cfg, T=9, splits=(0, 4))


def test_segment_ids_reset_the_state():
    """Logits of packed documents equal those of each document alone. Projections of std 0.5:
    at the default init the scan's part of the logits is ~1e-8, so a state leaking across
    documents stayed within the tolerance (a mutation that never reset passed)."""
    cfg = ModelConfig(layers=(layer("mamba1", state_size=4, chunk_size=4),), vocab_size=32,
                      d_model=16, num_heads=2, ffn_dim=0, init_std=0.5)
    assert_packed_documents_isolated(hj.create_model(cfg))


def test_parameter_count_follows_the_equations():
    d, e, n, r, k = 8, 16, 4, 1, 4
    cfg = ModelConfig(layers=(layer("mamba1", state_size=n),), vocab_size=10, d_model=d,
                      num_heads=1, ffn_dim=0)
    model = nnx.eval_shape(lambda: hj.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    mixer = 2 * d * e + k * e + e + e * (r + 2 * n) + r * e + e + e * n + e + e * d
    assert hj.count_params(model) == 10 * d + d + mixer + d  # embeddings, norms, mixer


@pytest.mark.parametrize("options, message", [
    (dict(state_size=0), "state_size=0: expected a positive integer"),
    (dict(dt_rank=0), "dt_rank=0"),
    (dict(dt_min=0.2, dt_max=0.1), "dt_min <= dt_max"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(layers=(layer("mamba1", **options),))
