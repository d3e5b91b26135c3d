"""`train.freeze`: matching parameters never move (weight decay included); others train."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.train import train
from hybrid_jax.train.optimizer import check_freeze, make_optimizer


def test_frozen_mlp_stays_and_attention_trains():
    model = hj.create_model(hj.ModelConfig(layers=("attention",), d_model=32, num_heads=2))
    optimizer = nnx.Optimizer(model, make_optimizer(hj.TrainConfig(freeze="/ffn/",
                                                                   warmup_steps=0),
                                                    scan_layers=False), wrt=nnx.Param)
    ffn, q = (np.asarray(model.blocks[0].ffn.up.kernel[...]),
              np.asarray(model.blocks[0].mixer.q_proj.kernel[...]))

    @nnx.jit  # one compile: eagerly every op of the backward and of AdamW compiles on its own
    def step(model, optimizer):
        optimizer.update(model, nnx.grad(lambda m: m(jnp.ones((1, 4), jnp.int32)).sum())(model))

    step(model, optimizer)
    np.testing.assert_array_equal(np.asarray(model.blocks[0].ffn.up.kernel[...]), ffn)
    assert np.abs(np.asarray(model.blocks[0].mixer.q_proj.kernel[...]) - q).max() > 1e-7


def test_a_pattern_matching_no_parameter_or_every_one_is_refused():
    params = nnx.state(hj.create_model(hj.ModelConfig(layers=("attention",), d_model=32,
                                                      num_heads=2)), nnx.Param)
    check_freeze("/ffn/", params)  # some, not all
    check_freeze("", params)  # nothing asked
    with pytest.raises(ValueError, match=r"train.freeze='/fnn/' matches no parameter, so nothing "
                                         r"would be frozen \(names look like blocks/0/"):
        check_freeze("/fnn/", params)
    with pytest.raises(ValueError, match=r"train.freeze='.' matches all \d+ parameters: nothing "
                                         "would train"):
        check_freeze(".", params)


def test_training_refuses_a_freeze_that_matches_nothing(tmp_path):
    experiment = hj.ExperimentConfig(
        name="freeze", model=hj.ModelConfig(layers=("attention",), vocab_size=16, d_model=16,
                                            num_heads=2),
        data=MQARConfig(vocab_size=16, seq_len=16, num_kv_pairs=2),
        train=hj.TrainConfig(steps=1, warmup_steps=0, batch_size=8, freeze="mlp"))
    with pytest.raises(ValueError, match="train.freeze='mlp' matches no parameter"):
        train(experiment, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_pattern_naming_some_layers_of_a_stacked_array_is_refused(tmp_path):
    """With scan_layers the three layers share one array per parameter (blocks/0/...):
    `blocks/1/` froze none of them and `blocks/0/` all three, silently; a pattern that names
    every layer of a stack, or none, stays."""
    model = hj.ModelConfig(layers=("attention",) * 3, vocab_size=16, d_model=16, num_heads=2,
                           scan_layers=True)
    params = nnx.state(nnx.eval_shape(lambda: LanguageModel(model, rngs=nnx.Rngs(0))), nnx.Param)
    check_freeze("/ffn/", params, model.layers)
    check_freeze("blocks/[0-2]/ffn/", params, model.layers)
    for pattern, named in (("blocks/0/", [0]), ("blocks/(1|2)/ffn/", [1, 2])):
        with pytest.raises(ValueError, match=(
                rf"names layers {re.escape(str(named))} of the stacked parameter blocks/0/.* "
                r"\(model.scan_layers: it holds layers \[0, 1, 2\], frozen or trained together\)")):
            check_freeze(pattern, params, model.layers)
    experiment = hj.ExperimentConfig(
        name="freeze", model=model, data=MQARConfig(vocab_size=16, seq_len=16, num_kv_pairs=2),
        train=hj.TrainConfig(steps=1, warmup_steps=0, batch_size=8, freeze="blocks/1/"))
    with pytest.raises(ValueError, match=r"names layers \[1\] of the stacked parameter"):
        train(experiment, tmp_path / "run", progress=False)
