"""Feed-forward branches against numpy: SwiGLU `W_down(silu(W_gate x) ⊙ W_up x)` and PHA's
Dual-FFN (a primary and an auxiliary SwiGLU, summed; the auxiliary a quarter as wide)."""

import jax
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.config import ModelConfig
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
