"""bf16 compute with float32 master parameters: dtypes where they belong, values close."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import hybrid_jax as hj
from tests.helpers import rel_err


def test_bf16_compute_keeps_float32_params_and_logits():
    config = hj.presets.get("transformer-tiny")
    fp32 = hj.create_model(config, seed=0)
    bf16 = hj.create_model(config.replace(dtype="bfloat16"), seed=0)
    params = jax.tree.leaves(nnx.state(bf16, nnx.Param))
    assert all(p.dtype == jnp.float32 for p in params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)

    def forward(model):
        graphdef, state = nnx.split(model)
        return jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, tokens)

    low, high = forward(bf16), forward(fp32)
    assert low.dtype == jnp.float32
    assert 0 < rel_err(low, high) < 3e-2  # bf16 rounding is there, and small
