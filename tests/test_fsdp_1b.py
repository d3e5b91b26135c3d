"""The ~1B presets (nha-hybrid-1b, transformer-1b) train with their parameters and AdamW state
sharded (FSDP) on 8 fake CPU devices.

Default suite, abstract shapes only (nothing of 1B is allocated): the trainer's own state layout
(`_abstract_train_state`, the rules table) shards every large parameter and AdamW moment over
all 8 devices on fsdp 8 and on fsdp 4 × tensor 2, so each device holds ≈ 1/8 of the bytes; the
parameter counts are the ones the presets document.

`slow`: the trainer's step really trains the presets' width with FSDP 8, layer scan and remat:
3 steps on one repeated batch (B 8, T 128), finite and decreasing losses, each device holding
1/8 of the live state. `HYBRID_JAX_1B_LAYERS` sets the depth: the default 4 cycles the preset's
distinct layer kinds (every parameter kind at the 1B width: 0.34B / 0.31B parameters; on 2 busy
CPU cores both took 15 min and peaked at 15.5 GB resident, ≈ 45 bytes per parameter); `full` is
the preset itself (by that rate ≈ 63 GB for nha-hybrid-1b, ≈ 50 GB for transformer-1b).
"""

import functools
import itertools
import math
import os

import jax
import numpy as np
import pytest

from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, TrainConfig
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.sharding import make_mesh, state_shardings
from hybrid_jax.train.trainer import (
    _abstract_train_state,
    init_train_state,
    make_train_step,
    to_device,
)

PRESETS = ("nha-hybrid-1b", "transformer-1b")
DEVICES = 8
LARGE = 1 << 16  # elements; smaller leaves (norm scales and their moments, the step) replicate
# T 128: two of NHA's 64-token chunks. On CPU (jax 0.10.2) a call whose T fits in one chunk
# (T <= 64) with no initial state gets garbage (NaN or ~1e30, varying between processes) from
# GSA's chunked readout under jit: the chunk step compiled with a constant zero state, correct
# eagerly or with the state as an argument, so apparently an XLA CPU bug; reported, not fixed.
B, T = 8, 128


def _experiment(model, mesh_config: MeshConfig) -> ExperimentConfig:
    return ExperimentConfig(
        name="fsdp-1b", model=model,
        data=MQARConfig(seq_len=T, vocab_size=model.vocab_size, num_kv_pairs=2),
        train=TrainConfig(batch_size=B, steps=10, warmup_steps=0, learning_rate=1e-3,
                          mesh=mesh_config))


@functools.cache
def _abstract_state(name: str, scan: bool = False):
    """The trainer's abstract state of preset `name` (`scan`: its layers stacked for
    `nnx.scan`): [0] the model, [1] the optimizer."""
    model = presets.get(name).replace(scan_layers=scan)
    experiment = _experiment(model, MeshConfig(data=1, fsdp=DEVICES))
    _, state, _, _ = _abstract_train_state(experiment, make_mesh(experiment.train.mesh))
    return state


def _leaves(state, mesh):
    """`(path, shape, itemsize, elements on one device)` of every array in `state` on `mesh`."""
    shardings = dict(jax.tree_util.tree_leaves_with_path(state_shardings(state, mesh)))
    rows = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        shard = shardings[path].shard_shape(leaf.shape)
        rows.append((jax.tree_util.keystr(path), leaf.shape, leaf.dtype.itemsize,
                     math.prod(shard)))
    return rows


@pytest.mark.parametrize("name", PRESETS)
def test_parameter_count_is_documented(name):
    count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(_abstract_state(name, False)[0]))
    assert 1.0e9 <= count <= 1.5e9, count
    assert f"{count:,}" in presets.PRESETS.get(name).__doc__, (name, count)


@pytest.mark.parametrize("mesh_config", [MeshConfig(data=1, fsdp=8),
                                         MeshConfig(data=1, fsdp=4, tensor=2)],
                         ids=["fsdp8", "fsdp4xtensor2"])
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("name", PRESETS)
def test_state_is_sharded_over_every_device(name, scan, mesh_config):
    state = _abstract_state(name, scan)
    rows = _leaves(state, make_mesh(mesh_config))
    unsharded = [(path, shape, per_device) for path, shape, _, per_device in rows
                 if math.prod(shape) >= LARGE and per_device * DEVICES != math.prod(shape)]
    assert not unsharded, f"large leaves not split over all {DEVICES} devices: {unsharded}"
    moments = [row for row in rows if "['mu']" in row[0] or "['nu']" in row[0]]
    assert len(moments) == 2 * len(jax.tree.leaves(state[0])), "an AdamW moment is missing"
    total = sum(math.prod(shape) * size for _, shape, size, _ in rows)
    per_device = sum(elements * size for _, _, size, elements in rows)
    # Parameters + mu + nu ≈ 3 × 4 bytes × N; only the small leaves are whole on every device.
    assert total > 3 * 4 * 1.0e9
    assert per_device <= total / DEVICES * 1.001, (
        f"{per_device / 2**30:.3f} GiB per device, {total / 2**30:.2f} GiB in all: more than "
        f"1/{DEVICES} + 0.1 %")


def _model(name: str, layers: str):
    """Preset `name` at depth `layers` ("full", or a count: its distinct layer kinds cycled),
    with layer scan and full remat."""
    config = presets.get(name)
    if layers != "full":
        kinds = tuple(dict.fromkeys(config.layers))
        config = config.replace(layers=tuple(itertools.islice(itertools.cycle(kinds),
                                                               int(layers))))
    return config.replace(scan_layers=True, remat="full")


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_trains_with_fsdp(name):
    model = _model(name, os.environ.get("HYBRID_JAX_1B_LAYERS", "4"))
    experiment = _experiment(model, MeshConfig(data=1, fsdp=DEVICES))
    mesh = make_mesh(experiment.train.mesh)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.vocab_size, (B, T + 1)).astype(np.int32)
    batch = to_device({"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                       "mask": np.ones((B, T), bool)}, mesh)
    ts = init_train_state(experiment, mesh)
    step = make_train_step(ts)
    losses, state = [], ts.state
    with jax.set_mesh(mesh):
        for _ in range(3):  # the same batch: each AdamW step lowers its loss
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
    assert np.all(np.isfinite(losses)) and losses[0] > losses[1] > losses[2], losses
    assert abs(losses[0] - math.log(model.vocab_size)) < 0.5, losses  # at init: ≈ uniform
    arrays = jax.tree.leaves(state)
    total = sum(x.nbytes for x in arrays)
    on_device_0 = sum(shard.data.nbytes for x in arrays for shard in x.addressable_shards
                      if shard.device == jax.devices()[0])
    assert on_device_0 <= total / DEVICES * 1.001, (on_device_0, total)
    print(f"{name} ({len(model.layers)} layers): losses {losses}; state {total / 2**30:.2f} GiB, "
          f"{on_device_0 / 2**30:.3f} GiB on one device")
