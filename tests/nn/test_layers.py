"""The shared layers on their own: a multi-axis Linear with a bias against numpy, and the
short conv's PyTorch-style initialisation."""

import numpy as np
import pytest
from flax import nnx

from hybrid_jax.nn.layers import Linear, ShortConv


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
