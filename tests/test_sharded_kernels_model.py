"""A whole tiny model whose mixers all take their Pallas rungs (interpret mode on CPU, as in
tests/ops/test_partition.py) trains one step on a `data=2 × tensor=2` mesh of fake CPU devices
exactly as on one device: each kernel runs on its device's batch rows and heads
(`hybrid_jax.ops.partition`)."""

import jax
import numpy as np
import pytest

from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig, TrainConfig, layer
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import (
    TrainState,
    _abstract_train_state,
    init_train_state,
    make_train_step,
    to_device,
)
from tests.helpers import assert_close
from tests.ops.test_partition import _count, pallas_on_cpu, vma_off  # noqa: F401 (fixtures)

B, T = 4, 16
PALLAS = dict(implementation="pallas")
EXPERIMENT = ExperimentConfig(
    name="sharded-kernels",
    model=ModelConfig(
        layers=(layer("attention", **PALLAS),
                layer("mamba2", ssm_head_dim=8, state_size=8, n_groups=2, chunk_size=8,
                      **PALLAS),
                layer("gdn", num_heads=4, chunk_size=8, **PALLAS),
                layer("gsa", num_heads=4, num_slots=4, chunk_size=8, **PALLAS),
                layer("nha", num_heads=4, num_kv_heads=2, num_slots=4, window=4, chunk_size=8,
                      **PALLAS)),
        vocab_size=64, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64),
    data=MQARConfig(vocab_size=64, seq_len=T, num_kv_pairs=2),
    train=TrainConfig(batch_size=B, steps=1, warmup_steps=0),
)


def _batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (B, T)).astype(np.int32)
    segment_ids = np.repeat([[0] * 5 + [1] * 3 + [2] * 8, [0] * T], 2, axis=0).astype(np.int32)
    return {"inputs": tokens, "targets": np.roll(tokens, -1, 1), "mask": np.ones((B, T), bool),
            "segment_ids": segment_ids}


def _one_step(mesh_config):
    mesh = make_mesh(mesh_config)
    with jax.set_mesh(mesh):
        ts = init_train_state(EXPERIMENT, mesh)
        state, metrics = make_train_step(ts)(ts.state, to_device(_batch(), mesh))
    return jax.device_get((state, metrics))


@pytest.mark.slow
def test_pallas_model_step_on_a_mesh_equals_one_device(pallas_on_cpu, vma_off):  # noqa: F811
    state, metrics = _one_step(MeshConfig(data=1))
    sharded_state, sharded_metrics = _one_step(MeshConfig(data=2, tensor=2))
    assert_close(sharded_metrics, metrics, 1e-5, "loss, accuracy, gradient norm")
    (model, optimizer), (sharded_model, sharded_optimizer) = (
        (s[0], s[1]) for s in (state, sharded_state))  # nnx.state((model, optimizer))
    assert_close(sharded_model, model, 1e-5, "parameters after the step")
    # Adam's moments: all as one vector to 1e-5; each to 1e-4, since GSA's q/k projections
    # have gradients ~1e-8 at init (grad norm ~3) that carry float32 rounding of larger ones.
    flat, expected = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(o)])
                      for o in (sharded_optimizer, optimizer))
    assert_close(flat, expected, 1e-5, "optimizer state")
    assert_close(sharded_optimizer, optimizer, 1e-4, "optimizer state")


def test_pallas_model_step_traces_with_check_vma(pallas_on_cpu):  # noqa: F811
    """The same step traced on the mesh with `check_vma` on (as the library runs it): every
    mixer's kernel inside a shard_map, forward and backward."""
    mesh = make_mesh(MeshConfig(data=2, tensor=2))
    graphdef, abstract_state, shardings, _ = _abstract_train_state(EXPERIMENT, mesh)
    step = make_train_step(TrainState(graphdef, abstract_state, shardings, mesh))
    with jax.set_mesh(mesh):
        jaxpr = step.trace(abstract_state, to_device(_batch(), mesh)).jaxpr.jaxpr
    assert _count(jaxpr, "shard_map") >= 2 * len(EXPERIMENT.model.layers)
