"""The tiny presets inside a caller's data-parallel `jax.shard_map` (its `check_vma` on, the
default), as scaling studies write their steps: the logits and the parameters' gradients
equal the model's under `jit` on one device (float32), packed documents included; so does
decoding (a prefill into a fresh cache, then steps in the caller's `lax.scan`, and Oryx's
per-step states from a fresh cache). The ops' loops start from states marked varying as their
inputs are (`pallas_kernels.vma`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from hybrid_jax import presets
from hybrid_jax.config import MeshConfig
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.sharding import make_mesh
from tests.helpers import assert_close

# One tiny preset per mixer kind (the others compose the same mixers).
TINY = ["transformer-tiny", "swa-transformer-tiny", "gdn-tiny", "gsa-tiny", "gss-tiny",
        "mamba2-tiny", "nha-tiny", "oryx-gdn-tiny", "oryx-mamba2-tiny", "pha-tiny"]
LENGTH = 24


def _loss_and_logits(graphdef, tokens, segment_ids):
    def loss(params):
        logits = nnx.merge(graphdef, params)(tokens, segment_ids_BT=segment_ids)
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1)), logits
    return loss


@pytest.mark.parametrize("name", TINY)
def test_tiny_preset_in_a_data_parallel_shard_map(name):
    config = presets.get(name)
    graphdef, params = nnx.split(LanguageModel(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (4, LENGTH)), jnp.int32)
    segment_ids = jnp.asarray(np.repeat([[0] * 7 + [1] * 10 + [2] * 7], 4, axis=0), jnp.int32)

    def step(params, tokens, segment_ids):
        (_, logits), grads = jax.value_and_grad(
            _loss_and_logits(graphdef, tokens, segment_ids), has_aux=True)(params)
        return logits, grads

    expected_logits, expected_grads = jax.jit(step)(params, tokens, segment_ids)
    rows = P("data")
    with jax.set_mesh(make_mesh(MeshConfig(data=2), jax.devices()[:2])):
        sharded = jax.shard_map(step, in_specs=(P(), rows, rows), out_specs=(rows, P()))
        logits, grads = jax.jit(sharded)(params, tokens, segment_ids)
    assert_close(logits, expected_logits, 1e-5, f"{name} logits")
    # The replicated parameters' gradients come summed over the 2 devices (autodiff's
    # transpose of their broadcast), each of its own rows' mean: twice the whole batch's.
    assert_close(jax.tree.map(lambda g: g / 2, grads), expected_grads, 1e-4, f"{name} gradients")


@pytest.mark.parametrize("name", TINY)
def test_tiny_preset_decodes_in_a_data_parallel_shard_map(name):
    config = presets.get(name)
    graphdef, params = nnx.split(LanguageModel(config, rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, config.vocab_size, (4, 11)),
                         jnp.int32)

    def decode(params, tokens):
        model = nnx.merge(graphdef, params)
        logits, cache = model.decode(tokens[:, :8], model.init_cache(tokens.shape[0], 12),
                                     fresh_cache=True)

        def step(cache, token_B):
            step_logits, cache = model.decode(token_B[:, None], cache)
            return cache, step_logits[:, 0]

        _, steps = jax.lax.scan(step, cache, tokens[:, 8:].T)
        recorded, _ = model.decode(tokens[:, :3], model.init_cache(tokens.shape[0], 12),
                                   record_steps=True)
        return logits, jnp.moveaxis(steps, 0, 1), recorded

    with jax.set_mesh(make_mesh(MeshConfig(data=2), jax.devices()[:2])):
        rows = P("data")
        sharded = jax.jit(jax.shard_map(decode, in_specs=(P(), rows), out_specs=rows))
        got = sharded(params, tokens)
    # The same calls on each half of the batch alone.
    halves = [jax.jit(decode)(params, tokens[i:i + 2]) for i in (0, 2)]
    for what, value, *expected in zip(("prefill", "steps", "recorded"), got, *halves,
                                      strict=True):
        assert_close(value, jnp.concatenate(expected), 1e-5, f"{name} {what}")
