"""Mamba-1 block: the mixer against a numpy per-token loop of its equations, decode equals the
parallel pass, packing resets the state, options are checked."""

import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.nn.mamba1 import Mamba1Options
from tests.helpers import assert_close, assert_packed_documents_isolated, normals
from tests.nn.test_gated_deltanet import (
    check_prefill_in_pieces,
    jitted_mixer,
    param,
    project,
    short_conv,
    silu,
    softplus,
)
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


def test_prefill_in_pieces_continues_the_state():
    """Later multi-token prefills continue the conv inputs and the scan state."""
    cfg = ModelConfig(layers=(layer("mamba1", state_size=4, chunk_size=4),) * 2,
                      vocab_size=32, d_model=16, num_heads=2, ffn_dim=0, init_std=0.5)
    check_prefill_in_pieces(cfg)


def test_init_follows_mamba_ssm():
    """S4D-real A_{c,n} = −(n + 1) for every channel, D = 1, dt = softplus(dt_bias)
    log-uniform in [dt_min, dt_max] (64 channels reach near both ends; a one-point range
    below `dt_init_floor` is raised to it), W_dt ~ U[±R^-1/2] with R = ⌈d_model / 16⌉ = 3
    (d_model 40), `conv_size` taps, W_out at init_std / √(2·num_layers); the defaults are
    mamba_ssm's."""
    defaults = Mamba1Options()
    assert (defaults.expand, defaults.state_size, defaults.conv_size, defaults.dt_rank) == (
        2, 16, 4, None)
    cfg = ModelConfig(layers=(layer("mamba1", state_size=5, conv_size=2, expand=1),) * 2,
                      vocab_size=8, d_model=40, num_heads=2, ffn_dim=0, init_std=0.4)
    mixer = hj.create_model(cfg).blocks[0].mixer
    np.testing.assert_allclose(np.exp(param(mixer.A_log)),
                               np.broadcast_to(np.arange(1, 6), (40, 5)), rtol=1e-6)
    assert np.all(param(mixer.D) == 1) and mixer.conv.weight.shape == (2, 40)
    dt = softplus(param(mixer.dt_bias))
    assert 1e-3 * 0.999 <= dt.min() < 1.5e-3 and 0.07 < dt.max() <= 0.1 * 1.001, dt
    w_dt = param(mixer.dt_proj)
    assert w_dt.shape == (3, 40) and 0.9 < np.abs(w_dt).max() / 3 ** -0.5 <= 1
    assert mixer.out_proj.init_std == pytest.approx(0.2) and mixer.x_proj.init_std == 0.4
    floored = hj.create_model(cfg.replace(layers=(layer(
        "mamba1", dt_min=1e-5, dt_max=1e-5, dt_init_floor=2e-4),))).blocks[0].mixer
    np.testing.assert_allclose(softplus(param(floored.dt_bias)), 2e-4, rtol=1e-3)


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
    (dict(dt_min=0.0), r"expected 0 < dt_min <= dt_max, got dt_min=0.0"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(layers=(layer("mamba1", **options),))
