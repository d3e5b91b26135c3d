"""Whole tiny models under context parallelism on 8 fake CPU devices: with a `seq` mesh axis
of 2, 4 and 8 (alone, and with FSDP and tensor axes, parameters laid out by the rules
table), the loss and every parameter's gradient equal the single-device ones, and so does a
whole train step of the trainer (AdamW, clipping, Oryx's mode draw): the parameters and the
optimizer state after it. The stack holds every block type (Oryx, PHA and the generic parallel
and sequential blocks too), on packed documents that start on and off shard boundaries."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import (
    ExperimentConfig,
    MeshConfig,
    ModelConfig,
    ModeSchedule,
    TrainConfig,
    layer,
)
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.sharding import make_mesh, state_shardings
from hybrid_jax.train.loss import mean_loss, token_stats
from hybrid_jax.train.trainer import init_train_state, make_train_step, to_device
from tests.helpers import assert_close

T = 32
CONFIG = ModelConfig(
    layers=(
        layer("attention", window=6),
        layer("mamba2", ssm_head_dim=8, state_size=4, chunk_size=4),
        layer("gdn", num_heads=2, chunk_size=4),
        layer("gsa", num_heads=2, num_slots=4, chunk_size=4),
        layer("nha", num_heads=2, num_slots=4, window=6, short_conv=True, chunk_size=4),
        layer("gss", state_size=4),
        layer("mamba1", state_size=4, chunk_size=4),
        layer("attention", cosine=True),
        layer("oryx", num_heads=2, chunk_size=4),
        layer("pha", branches=(layer("gss", expansion=2, state_size=4),
                               layer("attention", cosine=True, window=4), "dual_ffn")),
        layer("parallel", branches=(layer("mamba2", ssm_head_dim=8, state_size=4, chunk_size=4),
                                    layer("attention", window=6), "ffn"), mixing="learned"),
        layer("sequential", branches=(layer("attention", window=3), "ffn"), residual="post_norm"),
    ),
    vocab_size=32, d_model=16, num_heads=2, ffn_dim=16)


def _batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (2, T)).astype(np.int32)
    # Documents start at 8 (a shard boundary for 4 and 8 shards), 13 and 16; row 1 is one.
    segment_ids = np.asarray([[0] * 8 + [1] * 5 + [2] * 3 + [3] * 16, [0] * T], np.int32)
    starts = np.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)))
    positions = np.zeros_like(segment_ids)
    for b in range(2):
        for t in range(1, T):
            positions[b, t] = 0 if starts[b, t] else positions[b, t - 1] + 1
    return dict(inputs=tokens, targets=np.roll(tokens, -1, 1), mask=np.ones((2, T), bool),
                segment_ids=segment_ids, positions=positions)


def _value_and_grad(graphdef):
    """The stack's mean loss on a batch and its gradient, as a function of the state."""

    def f(state, batch):
        def loss(state):
            logits = nnx.merge(graphdef, state)(batch["inputs"], positions_BT=batch["positions"],
                                                segment_ids_BT=batch["segment_ids"])
            return mean_loss(token_stats(logits, batch["targets"], batch["mask"]))
        return jax.value_and_grad(loss)(state)

    return f


@functools.cache
def loss_and_grads(mesh_config: MeshConfig | None):
    graphdef, state = nnx.split(hj.create_model(CONFIG, seed=0))
    f = jax.jit(_value_and_grad(graphdef))
    batch = {name: jnp.asarray(x) for name, x in _batch().items()}
    if mesh_config is None:
        return jax.device_get(f(state, batch))
    mesh = make_mesh(mesh_config)
    with jax.set_mesh(mesh):  # parameters laid out by the rules table (FSDP, tensor)
        return jax.device_get(f(jax.device_put(state, state_shardings(state, mesh)), batch))


def _mesh_id(m: MeshConfig) -> str:
    return f"d{m.data}f{m.fsdp}s{m.seq}t{m.tensor}"


def test_every_activation_axis_name_has_a_rule():
    """Traced (not compiled) under a mesh, every logical axis name that the stack's layers
    constrain their activations to, and every parameter's, resolves in the rules table: a
    misspelt name raises here, in the default suite (the compiled comparisons below are
    `slow`)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: hj.create_model(CONFIG, seed=0)))
    batch = {name: jax.ShapeDtypeStruct(x.shape, x.dtype) for name, x in _batch().items()}
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, seq=2, tensor=2))
    state_shardings(state, mesh)
    with jax.set_mesh(mesh):
        loss, grads = jax.eval_shape(_value_and_grad(graphdef), state, batch)
    assert loss.shape == () and jax.tree.structure(grads) == jax.tree.structure(state)


# Each mesh compiles the whole stack's gradient (a minute of CPU): all are `slow`; the default
# suite has the train step below on FSDP x seq x tensor (part of the stack), whose Adam moments
# are the gradients (the op tests cover every mixer on 2, 4 and 8 shards).
@pytest.mark.parametrize("mesh_config", [
    pytest.param(MeshConfig(data=1, seq=2), marks=pytest.mark.slow),
    pytest.param(MeshConfig(data=1, fsdp=2, seq=2, tensor=2), marks=pytest.mark.slow),
    pytest.param(MeshConfig(data=1, seq=4), marks=pytest.mark.slow),
    pytest.param(MeshConfig(data=1, seq=8), marks=pytest.mark.slow)], ids=_mesh_id)
def test_every_block_type_matches_single_device(mesh_config):
    ref_loss, ref_grads = loss_and_grads(None)
    loss, grads = loss_and_grads(mesh_config)
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    # All gradients as one vector to 1e-5; each parameter's to 1e-3, since some are ~1e-7 in
    # norm (GSA's q/k projections at init) and carry float32 rounding of the larger ones.
    flat, ref_flat = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
                      for g in (grads, ref_grads))
    assert_close(flat, ref_flat, 1e-5, "all gradients")
    assert_close(grads, ref_grads, 1e-3, "grads")


# The whole stack, and a part of it for the default suite (windowed attention, the delta rule,
# NHA, Oryx's mode draw, PHA's parallel branches): a fifth of the compile time.
LAYER_SETS = {"all": CONFIG.layers, "some": tuple(CONFIG.layers[i] for i in (0, 2, 4, 8, 9))}


def _experiment(mesh_config: MeshConfig, layers: tuple) -> ExperimentConfig:
    # Oryx modes drawn per 8-token chunk; a learning rate of 1e-4 (updates ~0.5 % of the
    # weights): AdamW's first step is ~lr·sign(g), so a float32 rounding of a gradient as small
    # as Adam's epsilon moves its weight by up to ~lr·1e-3.
    return ExperimentConfig(
        name="cp-train-step", model=CONFIG.replace(layers=layers),
        data=MQARConfig(seq_len=T, vocab_size=32, num_kv_pairs=2),
        train=TrainConfig(batch_size=2, steps=10, warmup_steps=0, learning_rate=1e-4,
                          mesh=mesh_config,
                          mode_schedule=ModeSchedule(pattern="random_chunks", chunk=8)))


def train_step(mesh_config: MeshConfig, layers: str):
    """The trainer's state and step on `mesh_config` for the stack `layers` ("all" or "some"):
    the metrics and the (model, optimizer) state after one step, on the host."""
    experiment = _experiment(mesh_config, LAYER_SETS[layers])
    mesh = make_mesh(mesh_config, jax.devices()[:int(np.prod(mesh_config.sizes()))])
    ts = init_train_state(experiment, mesh)  # the same values on every mesh
    step = make_train_step(ts, modes=experiment.train.mode_schedule, seed=0)
    with jax.set_mesh(mesh):
        state, metrics = step(ts.state, to_device(_batch(), mesh))
    return jax.device_get(metrics), jax.device_get(state)


def _moments(optimizer_state, name: str) -> list:
    """Adam's `mu` or `nu` of every parameter, in the order of their paths."""
    moments = {str(path): value.get_value() for path, value in
               nnx.to_flat_state(optimizer_state) if name in path}
    return [moments[path] for path in sorted(moments)]


@functools.cache
def _reference_step(layers: str):
    return train_step(MeshConfig(data=1), layers)


@pytest.mark.parametrize("mesh_config,layers", [
    (MeshConfig(data=1, fsdp=2, seq=2, tensor=2), "some"),
    pytest.param(MeshConfig(data=1, fsdp=2, seq=2, tensor=2), "all", marks=pytest.mark.slow),
    pytest.param(MeshConfig(data=1, fsdp=2, seq=4), "all", marks=pytest.mark.slow),
    pytest.param(MeshConfig(data=1, seq=2, tensor=4), "all", marks=pytest.mark.slow),
    pytest.param(MeshConfig(data=2, seq=2, tensor=2), "all", marks=pytest.mark.slow)],
    ids=lambda x: _mesh_id(x) if isinstance(x, MeshConfig) else x)
def test_a_train_step_matches_single_device(mesh_config, layers):
    ref_metrics, ref_state = _reference_step(layers)
    metrics, state = train_step(mesh_config, layers)
    for key in ("loss", "grad_norm"):
        assert abs(metrics[key] - ref_metrics[key]) <= 1e-5 * abs(ref_metrics[key]), key
    # Adam's first step moves each weight by ≈ lr·sign(g), and where g ≈ 0 its sign is rounding
    # (the mesh sums in another order): all parameters as one vector to 1e-5, each leaf to 1e-3.
    params, ref_params = (jax.tree.leaves(s[0]) for s in (state, ref_state))
    flatten = lambda leaves: np.concatenate([np.ravel(x) for x in leaves])
    assert_close(flatten(params), flatten(ref_params), 1e-5, "parameters after one step")
    assert_close(params, ref_params, 1e-3, "each parameter after one step")
    assert int(state[1]["step"].get_value()) == int(ref_state[1]["step"].get_value()) == 1
    # Adam's moments after one step are (1 − β₁)·g and (1 − β₂)·g² of the clipped gradient g:
    # as one vector to 1e-5, each parameter's to 1e-3 (as the gradients above).
    for name in ("mu", "nu"):
        moments, ref_moments = (_moments(s[1], name) for s in (state, ref_state))
        assert len(moments) == len(ref_moments) > 20
        flat, ref_flat = (np.concatenate([np.ravel(x) for x in m]) for m in (moments, ref_moments))
        assert_close(flat, ref_flat, 1e-5, f"{name}, all parameters")
        assert_close(moments, ref_moments, 1e-3, name)


@pytest.mark.slow
def test_a_train_step_trading_heads_for_time_matches_single_device(monkeypatch):
    """Attention in its heads-for-time form (as on a GPU, where the kernels would run it; here
    the XLA rung): the whole stack's train step on FSDP x seq x tensor, as above."""
    import importlib

    module = importlib.import_module("hybrid_jax.ops.context_parallel.attention")
    monkeypatch.setattr(module, "_KERNEL_RUNGS", ("xla",))
    test_a_train_step_matches_single_device(MeshConfig(data=1, fsdp=2, seq=2, tensor=2), "all")
