"""GSS mixer: decode = parallel, an independent numpy per-token forward, packed documents,
Skew-HiPPO initialisation, option errors, presets."""

import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.nn.gss import GSSOptions, skew_hippo_imag
from hybrid_jax.registry import block_names
from tests.helpers import assert_close, assert_packed_documents_isolated
from tests.nn.test_gated_deltanet import check_prefill_in_pieces
from tests.nn.test_lm import check_decode_matches
from tests.nn.test_mamba2 import first_mixer, mixer_forward, numpy_params, starts_of

SMALL = layer("gss", expansion=2, ssm_dim=4, state_size=6)


def small_config(*layers, **kwargs) -> ModelConfig:
    # Large projections and steps (log Δ near 0) make the state's contribution to the output
    # large, so a state leaking across a document boundary shows as a large error.
    return ModelConfig(layers=layers or (SMALL,), vocab_size=32, d_model=16, num_heads=2,
                       init_std=0.5, **kwargs)


@pytest.fixture(scope="module")
def mixer():
    return first_mixer(small_config(layer("gss", expansion=2, ssm_dim=4, state_size=6,
                                          dt_min=0.3, dt_max=1.0)))


def gelu(x):  # tanh approximation (jax.nn.gelu's default)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gss_numpy(p, x, starts, *, eps):
    """GSS from the equations, one token at a time, complex128."""
    x = np.asarray(x, np.float64)
    v = gelu(x @ p["v_proj.kernel"])
    u = gelu(x @ p["u_proj.kernel"])
    u = u / np.sqrt(np.mean(u ** 2, axis=-1, keepdims=True) + eps) * p["ssm_norm.scale"]
    lam = -np.exp(p["lambda_log_neg_re"]) + 1j * np.exp(p["lambda_log_im"])  # [N]
    step = np.exp(p["log_dt"])[:, None]  # [H, 1]
    w = p["w_re"] + 1j * p["w_im"]  # [H, N]
    decay = np.exp(lam * step)
    coeff = w * (decay - 1) / lam
    y = np.zeros_like(u)
    for b in range(x.shape[0]):
        state = np.zeros(w.shape, complex)
        for t in range(x.shape[1]):
            state = (0 if starts[b, t] else decay) * state + u[b, t][:, None]
            y[b, t] = (coeff * state).sum(-1).real + p["D"] * u[b, t]
    return ((y @ p["uc_proj.kernel"]) * v) @ p["out_proj.kernel"]


@pytest.mark.parametrize("packed", [False, True])
def test_mixer_matches_numpy_per_token(mixer, packed):
    """FFT convolution (or, packed, the resetting scan) against the numpy recurrence."""
    x = np.random.default_rng(0).standard_normal((2, 11, 16))
    seg = jnp.asarray([[0] * 4 + [1] * 7, [0] * 9 + [1] * 2]) if packed else None
    got = mixer_forward(mixer, jnp.asarray(x, jnp.float32), seg)
    want = gss_numpy(numpy_params(mixer), x, starts_of(seg, x.shape[:2]),
                     eps=small_config().norm_eps)
    assert_close(got, want, 1e-5)


def test_decode_matches_parallel():
    """Single steps, and prefills through the FFT form with an initial state."""
    check_decode_matches(small_config(), T=11, splits=(0, 6))


def test_prefill_in_pieces_continues_the_state():
    """Later multi-token prefills continue the DSS state (an initial state of the FFT form)."""
    check_prefill_in_pieces(small_config(SMALL, layer("gss", expansion=2, ssm_dim=4,
                                                      state_size=6, dt_min=0.3, dt_max=1.0)))


def test_defaults_and_norm_eps():
    """The paper's proportions (F = 4·d_model, H = d_model / 4, N = 512), and the DSS input
    norm at the model's `norm_eps` (1e-1: large enough to move the output)."""
    assert (GSSOptions().expansion, GSSOptions().ssm_dim, GSSOptions().state_size) == (4, None,
                                                                                       512)
    mixer = first_mixer(ModelConfig(layers=(layer("gss", state_size=2),), vocab_size=8,
                                    d_model=16, num_heads=2))
    assert (mixer.v_proj.kernel.shape, mixer.u_proj.kernel.shape) == ((16, 64), (16, 4))
    noisy = first_mixer(small_config(SMALL, norm_eps=1e-1))
    x = np.random.default_rng(0).standard_normal((1, 5, 16))
    want = gss_numpy(numpy_params(noisy), x, starts_of(None, x.shape[:2]), eps=1e-1)
    assert_close(mixer_forward(noisy, jnp.asarray(x, jnp.float32)), want, 1e-5)


def test_packed_document_equals_document_alone():
    """Logits of packed documents equal those of each document alone."""
    assert_packed_documents_isolated(hj.create_model(small_config()), lengths=(5, 9))


def test_skew_hippo_init_is_the_normal_hippo_spectrum():
    """−½ + iω are eigenvalues of HiPPO-LegS plus its low-rank correction P Pᵀ (DSS's
    Skew-HiPPO), built here from the LegS definition."""
    size = 8
    n = np.arange(size)
    legs = -np.where(n[:, None] > n[None, :], np.sqrt(np.outer(2 * n + 1, 2 * n + 1)), 0)
    legs -= np.diag(n + 1.0)
    normal = legs + np.outer(np.sqrt(n + 0.5), np.sqrt(n + 0.5))
    eigs = np.linalg.eigvals(normal)
    expected = np.sort(eigs[eigs.imag > 0].imag)
    np.testing.assert_allclose(eigs.real, -0.5, atol=1e-9)
    np.testing.assert_allclose(skew_hippo_imag(size // 2), expected, rtol=1e-9)


def test_init(mixer):
    np.testing.assert_allclose(np.exp(mixer.lambda_log_neg_re[...]), 0.5, rtol=1e-6)
    np.testing.assert_allclose(np.exp(mixer.lambda_log_im[...]), skew_hippo_imag(6), rtol=1e-5)
    step = np.exp(mixer.log_dt[...])
    assert mixer.log_dt.shape == (4,) and np.all((step >= 0.3 * 0.999) & (step <= 1.001))


def test_init_of_the_output_weights():
    """W ~ CN(0, 1): real and imaginary parts each of std √½ (DSS); 2048 draws each, so a std
    off by 10 % is many standard errors out."""
    wide = first_mixer(small_config(layer("gss", expansion=1, ssm_dim=32, state_size=64)))
    for name in ("w_re", "w_im"):
        values = np.asarray(getattr(wide, name)[...])
        assert values.shape == (32, 64) and abs(values.std() - np.sqrt(0.5)) < 0.04, name
        assert abs(values.mean()) < 0.05, name
    w = np.asarray(wide.w_re[...]) + 1j * np.asarray(wide.w_im[...])
    assert abs(np.mean(np.abs(w) ** 2) - 1.0) < 0.1


def test_init_draws_steps_log_uniformly_d_normally_and_scales_the_output():
    """log Δ ~ U[log dt_min, log dt_max] (256 channels reach near both ends), D ~ N(0, 1),
    W_v, W_u, W_uc at init_std and W_o at init_std / √(2·num_layers)."""
    wide = first_mixer(small_config(layer("gss", expansion=1, ssm_dim=256, state_size=2),
                                    SMALL))
    step = np.exp(np.asarray(wide.log_dt[...]))
    assert 1e-3 * 0.999 <= step.min() < 1.2e-3 and 0.08 < step.max() <= 0.1 * 1.001
    d = np.asarray(wide.D[...])
    assert abs(d.mean()) < 0.2 and abs(d.std() - 1) < 0.15, (d.mean(), d.std())
    for name, std in (("v_proj", 0.5), ("u_proj", 0.5), ("uc_proj", 0.5), ("out_proj", 0.25)):
        assert getattr(wide, name).init_std == pytest.approx(std), name


@pytest.mark.parametrize("options, message", [
    (dict(ssm_dim=0), r"GSSOptions.ssm_dim=0: expected a positive integer or None"),
    (dict(expansion=0), r"GSSOptions.expansion=0: expected a positive integer"),
    (dict(dt_min=0.0), r"expected 0 < dt_min <= dt_max"),
    (dict(dt_min=0.2, dt_max=0.1), r"expected 0 < dt_min <= dt_max, got dt_min=0.2, "
                                   r"dt_max=0.1"),
    (dict(window=4), r"unknown option\(s\) \['window'\]"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=r"layers\[0\] \('gss'\).*" + message):
        ModelConfig(layers=(layer("gss", **options),), d_model=16)


def test_ssm_dim_default_needs_width():
    with pytest.raises(ValueError, match=r"ssm_dim=None means d_model // 4, which is 0"):
        ModelConfig(layers=("gss",), d_model=2, num_heads=1)


def test_preset_and_block_are_registered():
    """(What `hybrid-jax list` prints from these registries is tested once, in test_cli.)"""
    assert "gss" in block_names() and "gss-tiny" in presets.names()
