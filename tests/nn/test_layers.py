"""The shared layers on their own, against numpy: a multi-axis Linear with a bias, its axes,
checks and compute dtype; the norms, RoPE and SwiGLU passing their settings; the step-size bias
initialiser; the short conv's values, decode caches and PyTorch-style initialisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import ops
from hybrid_jax.cache import ConvHistory
from hybrid_jax.nn.layers import (
    Embedding,
    GatedRMSNorm,
    Linear,
    RMSNorm,
    RoPE,
    ShortConv,
    SwiGLU,
    dt_bias_init,
    param,
)
from hybrid_jax.ops import context_parallel
from tests.helpers import assert_close, normals, rel_err
from tests.nn.test_gated_deltanet import rms, silu


def test_linear_contracts_every_input_axis_and_adds_its_bias():
    """`y[b, o1, o2] = Σ_{i1, i2} x[b, i1, i2] · W[i1, i2, o1, o2] + bias[o1, o2]`, with a
    bias that is not zero (it is initialised to zero, which hides its sign)."""
    linear = Linear((3, 4), (2, 5), axes=(None, None, None, None), use_bias=True,
                    rngs=nnx.Rngs(0), std=1.0)
    rng = np.random.default_rng(0)
    linear.bias[...] = rng.standard_normal((2, 5))
    x = rng.standard_normal((6, 3, 4)).astype(np.float32)
    want = np.einsum("bij,ijop->bop", x, np.asarray(linear.kernel[...]))
    np.testing.assert_allclose(linear(x), want + np.asarray(linear.bias[...]), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match=r"Linear expects input \[\.\.\., 3, 4\], got shape"):
        linear(x[..., :3])


@pytest.mark.parametrize("size", [2, 4])
def test_short_conv_taps_are_uniform_within_pytorchs_depthwise_bound(size):
    """PyTorch's Conv1d default for a depthwise kernel: U(−b, b), b = 1/√(fan_in) = 1/√size."""
    taps = np.asarray(ShortConv(4096, size, rngs=nnx.Rngs(0)).weight[...])
    bound = size ** -0.5
    assert taps.shape == (size, 4096)
    assert np.abs(taps).max() <= bound and np.abs(taps).max() > 0.999 * bound
    assert abs(taps.mean()) < 0.01 * bound and abs(taps.std() - bound / np.sqrt(3)) < 0.01 * bound


def test_param_and_linear_carry_and_check_their_logical_axes():
    """A parameter names every dimension (one short is refused, naming both), and a Linear's
    bias carries the kernel's output axes (the ones after the input axes), for the sharding
    rules; the kernel is drawn with the given std."""
    with pytest.raises(ValueError, match=r"logical axes \('embed',\) do not match parameter "
                                         r"shape \(3, 4\)"):
        param(nnx.Rngs(0), nnx.initializers.zeros, (3, 4), jnp.float32, ("embed",))
    linear = Linear(64, (4, 64), axes=("embed", "heads", "head_dim"), use_bias=True,
                    rngs=nnx.Rngs(0), std=0.5)
    assert linear.kernel.get_metadata()["logical_axes"] == ("embed", "heads", "head_dim")
    assert linear.bias.get_metadata()["logical_axes"] == ("heads", "head_dim")
    assert abs(float(jnp.std(linear.kernel[...])) - 0.5) < 0.01


def test_linear_checks_every_input_axis():
    """The whole trailing input shape is checked, not only its last axis."""
    linear = Linear((3, 4), 2, axes=(None, None, None), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"Linear expects input \[\.\.\., 3, 4\], got shape "
                                         r"\(6, 2, 4\)"):
        linear(np.zeros((6, 2, 4), np.float32))


def test_linear_and_embedding_compute_in_their_dtype():
    """float32 parameters and inputs, bfloat16 compute dtype: the outputs are bfloat16 (the
    input and the bias are cast too, not promoted back to float32), of the right value."""
    linear = Linear(4, 3, axes=(None, None), use_bias=True, rngs=nnx.Rngs(0), std=1.0,
                    dtype=jnp.bfloat16)
    linear.bias[...] = jnp.asarray([0.5, -1.0, 2.0])
    x = normals(0, (2, 4), dtype=np.float32)
    y = linear(x)
    assert y.dtype == jnp.bfloat16
    assert_close(y, np.asarray(x) @ np.asarray(linear.kernel[...]) + [0.5, -1.0, 2.0], 1e-2)
    embed = Embedding(8, 4, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    tokens = jnp.asarray([[1, 7]])
    assert embed(tokens).dtype == jnp.bfloat16
    assert_close(embed(tokens), np.asarray(embed.table[...])[[[1, 7]]], 1e-2)


def test_linear_logits_refuse_a_bias():
    """An output head with a bias would silently drop it (`ops.logits` takes none)."""
    linear = Linear(4, 3, axes=(None, None), use_bias=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"Linear.logits needs one input and one output axis "
                                         r"and no bias, got \(4,\) → \(3,\), bias True"):
        linear.logits(jnp.zeros((1, 2, 4)))


def test_dt_bias_starts_softplus_at_a_floored_log_uniform_step():
    """softplus(bias) = max(dt, floor), dt log-uniform in [dt_min, dt_max]: with the floor
    inside the range, a third of log(dt) lies below it (log 10 of log 1000) and sits at the
    floor exactly."""
    bias = np.asarray(dt_bias_init(1e-4, 1e-1, 1e-3)(jax.random.key(0), (30000,), jnp.float32),
                      np.float64)
    dt = np.logaddexp(0.0, bias)
    np.testing.assert_allclose(dt.min(), 1e-3, rtol=1e-4)
    assert dt.max() <= 1e-1 * (1 + 1e-4)
    floored = np.isclose(dt, 1e-3, rtol=1e-4).mean()
    assert abs(floored - 1 / 3) < 0.02, floored
    above = np.log10(dt[dt > 1.001e-3])
    assert abs(np.mean(above) - (-2.0)) < 0.02  # log-uniform on [−3, −1]


def test_norm_layers_match_numpy():
    """RMSNorm's default ε is 1e-6 (seen at inputs of RMS 1e-3, where it is as large as
    mean(x²)); GatedRMSNorm normalises each group of `group_size` channels, the gate before
    (`norm_before_gate=False`) or after the norm, with γ; a group size that does not divide
    the width is refused."""
    x = 1e-3 * normals(0, (2, 3, 8), dtype=np.float32)
    gamma = 1.0 + 0.1 * np.arange(8.0)
    norm = RMSNorm(8)
    norm.scale[...] = gamma
    assert_close(norm(x), rms(np.asarray(x, np.float64), 1e-6) * gamma, 1e-5, "rms")
    x, z = (np.asarray(a, np.float64)
            for a in normals(1, (2, 3, 8), (2, 3, 8), dtype=np.float32))
    groups = lambda a: a.reshape(2, 3, 2, 4)
    for before in (True, False):
        gated = GatedRMSNorm(8, group_size=4, norm_before_gate=before)
        gated.scale[...] = gamma
        y = gated(jnp.asarray(x, jnp.float32), jnp.asarray(z, jnp.float32))
        if before:
            want = rms(groups(x), 1e-6).reshape(x.shape) * gamma * silu(z)
        else:
            want = rms(groups(x * silu(z)), 1e-6).reshape(x.shape) * gamma
        assert_close(y, want, 1e-5, f"norm_before_gate={before}")
    with pytest.raises(ValueError, match="GatedRMSNorm: group_size=3 does not divide dim=8"):
        GatedRMSNorm(8, group_size=3)


def test_rope_layer_passes_its_theta_fraction_and_scaling():
    """`RoPE(theta=100, fraction=0.5)` against numpy rotate-half on the first 4 of 8 channels
    (frequencies 100^(−2i/4)), the rest passed through; a scaled one is the op's."""
    x = np.asarray(normals(0, (1, 5, 2, 8), dtype=np.float32), np.float64)
    positions = np.arange(3, 8)[None]
    angles = positions[..., None, None] * 100.0 ** (-np.arange(2) * 2 / 4)  # [1, T, 1, 2]
    x1, x2 = x[..., :2], x[..., 2:4]
    want = np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                           x2 * np.cos(angles) + x1 * np.sin(angles), x[..., 4:]], axis=-1)
    y = RoPE(theta=100.0, fraction=0.5)(jnp.asarray(x, jnp.float32), jnp.asarray(positions))
    assert_close(y, want, 1e-5)
    scaling = (8.0, 1.0, 4.0, 4)
    y = RoPE(theta=100.0, scaling=scaling)(jnp.asarray(x, jnp.float32), jnp.asarray(positions))
    assert_close(y, ops.apply_rope(jnp.asarray(x, jnp.float32), jnp.asarray(positions),
                                   theta=100.0, scaling=scaling), 1e-7, "scaled")
    assert rel_err(y, ops.apply_rope(jnp.asarray(x, jnp.float32), jnp.asarray(positions),
                                     theta=100.0)) > 1e-3  # the scaling shows


def test_swiglu_draws_its_down_projection_with_out_std():
    swiglu = SwiGLU(256, 256, rngs=nnx.Rngs(0), std=0.5, out_std=0.01)
    for name, std in (("gate", 0.5), ("up", 0.5), ("down", 0.01)):
        kernel = getattr(swiglu, name).kernel[...]
        assert abs(float(jnp.std(kernel)) / std - 1) < 0.02, name


@pytest.mark.parametrize("activation", [False, True])
def test_short_conv_matches_numpy_and_decodes_into_either_cache(activation):
    """`y_t = act(Σ_i w_i x_{t−i} + b)`, restarting at a document start; decoding two
    prompts' tokens continues a `ConvCache` (the last size − 1 inputs) or a `ConvHistory`
    (every input kept: the old cache's, then the new ones)."""
    conv = ShortConv(3, 3, rngs=nnx.Rngs(0), use_bias=True, activation=activation)
    conv.bias[...] = jnp.asarray([0.3, -0.2, 0.1])
    w, b = np.asarray(conv.weight[...], np.float64), np.asarray(conv.bias[...], np.float64)
    x = np.asarray(normals(1, (1, 6, 3), dtype=np.float32), np.float64)
    ids = np.asarray([[1, 1, 1, 1, 2, 2]])
    want = np.zeros_like(x)
    for t in range(6):
        for i in range(3):
            if t - i >= 0 and ids[0, t - i] == ids[0, t]:
                want[:, t] += w[i] * x[:, t - i]
    want += b
    want = silu(want) if activation else want
    x32 = jnp.asarray(x, jnp.float32)
    assert_close(conv(x32, jnp.asarray(ids)), want, 1e-5, "forward")
    whole = sum(w[i] * np.pad(x, ((0, 0), (i, 0), (0, 0)))[:, :6] for i in range(3)) + b
    whole = silu(whole) if activation else whole  # one document
    y, cache = conv.decode(x32[:, :4], conv.init_cache(1, 3, jnp.float32))
    y2, cache = conv.decode(x32[:, 4:], cache)
    assert cache.inputs.shape == (1, 2, 3)
    assert_close(jnp.concatenate([y, y2], 1), whole, 1e-5, "decode")
    assert_close(cache.inputs, x[:, 4:], 1e-7, "cache")
    y, history = conv.decode(x32[:, 2:], ConvHistory(x32[:, :2]))
    assert_close(y, whole[:, 2:], 1e-5, "history decode")
    assert_close(history.inputs, x, 1e-7, "history")


def test_short_conv_tells_the_op_its_channels_are_split_heads(monkeypatch):
    """With a channel axis name (heads or hidden units, which tensor parallelism splits) the
    layer calls the op with `head_channels=True`, so the kernels run on each device's
    channels; without one, False. A size below 1 is refused."""
    seen = []
    real = context_parallel.short_conv
    monkeypatch.setattr(context_parallel, "short_conv",
                        lambda *a, **kw: seen.append(kw["head_channels"]) or real(*a, **kw))
    x = jnp.ones((1, 4, 2))
    ShortConv(2, 2, rngs=nnx.Rngs(0), axis="heads")(x)
    ShortConv(2, 2, rngs=nnx.Rngs(0))(x)
    assert seen == [True, False]
    with pytest.raises(ValueError, match="ShortConv: size must be >= 1, got 0"):
        ShortConv(2, 0, rngs=nnx.Rngs(0))
