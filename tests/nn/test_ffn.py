"""Feed-forward branches against numpy: SwiGLU `W_down(silu(W_gate x) ⊙ W_up x)` and PHA's
Dual-FFN (a primary and an auxiliary SwiGLU, summed; the auxiliary a quarter as wide); their
widths checked, their init stds, compute dtype and DeepNorm gains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.config import ModelConfig
from hybrid_jax.nn.blocks import deepnorm_init
from hybrid_jax.nn.ffn import FFN, DualFFN, DualFFNOptions, FFNOptions
from tests.helpers import assert_close, normals
from tests.nn.test_gated_deltanet import project, silu

CONFIG = ModelConfig(layers=("attention",), vocab_size=8, d_model=16, num_heads=2, ffn_dim=64,
                     init_std=0.5)


def swiglu(module, x) -> np.ndarray:
    return project(silu(project(x, module.gate)) * project(x, module.up), module.down)


@pytest.mark.parametrize("branch, widths", [
    (lambda rngs: FFN(CONFIG, FFNOptions(ffn_dim=24), rngs=rngs), [24]),
    (lambda rngs: FFN(CONFIG, FFNOptions(), rngs=rngs), [64]),  # the model's ffn_dim
    (lambda rngs: DualFFN(CONFIG, DualFFNOptions(), rngs=rngs), [64, 16]),  # aux: a quarter
    (lambda rngs: DualFFN(CONFIG, DualFFNOptions(ffn_dim=20, aux_ffn_dim=6), rngs=rngs),
     [20, 6]),
], ids=["ffn", "ffn-model-width", "dual", "dual-widths"])
def test_branch_matches_numpy(branch, widths):
    module = branch(nnx.Rngs(0))
    arms = [module] if isinstance(module, FFN) else [module.primary, module.aux]
    assert [arm.up.kernel.shape[-1] for arm in arms] == widths
    x = normals(0, (2, 5, 16), dtype=np.float32)
    expected = sum(swiglu(arm, np.asarray(x, np.float64)) for arm in arms)
    assert_close(jax.jit(lambda x: module(x))(x), expected, 2e-6)


@pytest.mark.parametrize("options, message", [
    (dict(ffn_dim=0), "DualFFNOptions.ffn_dim=0: expected a positive integer or None"),
    (dict(aux_ffn_dim=0), "DualFFNOptions.aux_ffn_dim=0: expected a positive integer or None"),
    (dict(ffn_dim=2.5), r"DualFFNOptions.ffn_dim=2.5: expected a positive integer or None"),
], ids=["ffn_dim", "aux_ffn_dim", "float"])
def test_bad_dual_ffn_widths_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        DualFFNOptions(**options)


@pytest.mark.parametrize("width", [0, -4, 2.5])
def test_bad_ffn_width_is_named_not_blamed_on_the_model(width):
    with pytest.raises(ValueError, match=rf"FFNOptions.ffn_dim={width!r}: expected a positive "
                                         r"integer or None"):
        FFNOptions(ffn_dim=width)


def test_branches_refuse_a_model_without_ffn_width():
    """A model with `ffn_dim=0` (no FFN sublayers) has no width for an FFN branch that takes
    the model's: both branch types say so at construction."""
    config = CONFIG.replace(ffn_dim=0)
    with pytest.raises(ValueError, match=r"an 'ffn' branch needs ffn_dim >= 1 \(the model's "
                                         r"ffn_dim is 0\)"):
        FFN(config, FFNOptions(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"a 'dual_ffn' branch needs ffn_dim >= 1 \(the "
                                         r"model's ffn_dim is 0\)"):
        DualFFN(config, DualFFNOptions(), rngs=nnx.Rngs(0))


def test_dual_ffn_auxiliary_width_is_at_least_one():
    """The auxiliary arm's default width is a quarter of the primary's, never below one unit;
    a given one is kept."""
    assert DualFFNOptions(ffn_dim=3).widths(CONFIG) == (3, 1)
    assert DualFFNOptions(ffn_dim=9).widths(CONFIG) == (9, 2)
    assert DualFFNOptions(aux_ffn_dim=5).widths(CONFIG) == (64, 5)


def test_branch_init_stds_and_compute_dtype():
    """Gate and up kernels are drawn with the model's `init_std`, the down projection (writing
    into the residual stream) with init_std / √(2·num_layers); float32 parameters compute in
    the model's bfloat16."""
    config = ModelConfig(layers=("attention",) * 2, vocab_size=8, d_model=256, num_heads=2,
                         ffn_dim=256, init_std=0.5, dtype="bfloat16")
    for module in (FFN(config, FFNOptions(), rngs=nnx.Rngs(0)),
                   DualFFN(config, DualFFNOptions(aux_ffn_dim=256), rngs=nnx.Rngs(0))):
        arms = [module] if isinstance(module, FFN) else [module.primary, module.aux]
        for arm in arms:
            for name, std in (("gate", 0.5), ("up", 0.5), ("down", 0.25)):
                kernel = getattr(arm, name).kernel[...]
                assert kernel.dtype == jnp.float32
                assert abs(float(jnp.std(kernel)) / std - 1) < 0.02, (type(module), name)
        assert module(jnp.ones((1, 2, 256))).dtype == jnp.bfloat16


def test_deepnorm_scales_the_up_and_down_projections_not_the_gate():
    """`deepnorm_init(FFN, β)`: every kernel rescaled to Xavier-normal, times β on `up` and
    `down` only (a scaled gate would shrink the arm by β³, not β²)."""
    module = FFN(CONFIG, FFNOptions(ffn_dim=24), rngs=nnx.Rngs(0))
    linears = {name: getattr(module, name) for name in ("gate", "up", "down")}
    before = {name: np.asarray(linear.kernel[...]) for name, linear in linears.items()}
    deepnorm_init(module, 0.5)
    for name, linear in linears.items():
        gain = 1.0 if name == "gate" else 0.5
        xavier = np.sqrt(2 / (16 + 24))  # fan_in + fan_out = d_model + ffn_dim
        assert_close(linear.kernel[...], before[name] * gain * xavier / linear.init_std, 1e-6,
                     name)
