"""`train.freeze`: matching parameters never move (weight decay included); others train."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.train.optimizer import make_optimizer


def test_frozen_mlp_stays_and_attention_trains():
    model = hj.create_model(hj.ModelConfig(layers=("attention",), d_model=32, num_heads=2))
    optimizer = nnx.Optimizer(model, make_optimizer(hj.TrainConfig(freeze="/ffn/",
                                                                   warmup_steps=0)),
                              wrt=nnx.Param)
    ffn, q = (np.asarray(model.blocks[0].ffn.up.kernel[...]),
              np.asarray(model.blocks[0].mixer.q_proj.kernel[...]))

    @nnx.jit  # one compile: eagerly every op of the backward and of AdamW compiles on its own
    def step(model, optimizer):
        optimizer.update(model, nnx.grad(lambda m: m(jnp.ones((1, 4), jnp.int32)).sum())(model))

    step(model, optimizer)
    np.testing.assert_array_equal(np.asarray(model.blocks[0].ffn.up.kernel[...]), ffn)
    assert np.abs(np.asarray(model.blocks[0].mixer.q_proj.kernel[...]) - q).max() > 1e-7
