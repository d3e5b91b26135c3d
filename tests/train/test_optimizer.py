"""`global_norm` (small leaves reduced together) and the clipping built on it, against float64
numpy and optax's own `clip_by_global_norm`; the schedule, the decay mask and the whole chain
against optax built by hand."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import hybrid_jax as hj
from hybrid_jax.config import TrainConfig
from hybrid_jax.train.optimizer import (
    SMALL_LEAF,
    clip_by_global_norm,
    global_norm,
    learning_rate_schedule,
    make_optimizer,
)


def _tree(seed: int = 0):
    """Leaves on both sides of `SMALL_LEAF` (one just above it), a scalar, a bf16 leaf."""
    rng = np.random.default_rng(seed)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    return {"big": draw(SMALL_LEAF + 1), "matrix": draw(300, 257), "taps": draw(4, 96),
            "bias": draw(96), "scalar": draw(), "half": draw(5, 7).astype(jnp.bfloat16),
            "nested": [draw(3), draw(2, 2)]}


def _numpy_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                             for x in jax.tree.leaves(tree))))


def test_global_norm_is_the_norm_of_every_leaf():
    tree = _tree()
    np.testing.assert_allclose(float(jax.jit(global_norm)(tree)), _numpy_norm(tree), rtol=1e-6)
    small_only = {k: v for k, v in tree.items() if k not in ("big", "matrix")}
    np.testing.assert_allclose(float(global_norm(small_only)), _numpy_norm(small_only),
                               rtol=1e-6)
    assert float(global_norm({})) == 0.0


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_global_norm_of_sharded_leaves(axis_type):
    """Leaves split over 8 devices (the small ones gathered for their shared reduction)."""
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    tree = _tree(1)
    put = lambda x: jax.device_put(x, NamedSharding(
        mesh, PartitionSpec("x") if x.ndim and x.shape[0] % 8 == 0 else PartitionSpec()))
    sharded = jax.tree.map(put, tree)
    np.testing.assert_allclose(float(jax.jit(global_norm)(sharded)), _numpy_norm(tree),
                               rtol=1e-6)


def test_global_norm_counts_a_leaf_of_exactly_small_leaf_elements():
    """A leaf of exactly `SMALL_LEAF` elements is counted once (in the shared reduction), next
    to leaves either side of the boundary; `_tree` has none exactly at it."""
    tree = {"edge": jnp.full((SMALL_LEAF,), 2.0), "big": jnp.ones(SMALL_LEAF + 1),
            "small": jnp.ones(3)}
    np.testing.assert_allclose(float(global_norm(tree)),
                               np.sqrt(4 * SMALL_LEAF + SMALL_LEAF + 1 + 3), rtol=1e-6)
    np.testing.assert_allclose(float(global_norm({"edge": tree["edge"]})),
                               2 * np.sqrt(SMALL_LEAF), rtol=1e-6)


@pytest.mark.parametrize("max_norm", [1e-3, 1e4])  # clipped, and left alone
def test_clip_matches_optax(max_norm):
    tree = {k: v for k, v in _tree(2).items() if k != "half"}
    ours, theirs = clip_by_global_norm(max_norm), optax.clip_by_global_norm(max_norm)
    state = ours.init(tree)
    assert jax.tree.structure(state) == jax.tree.structure(theirs.init(tree))
    clipped, _ = jax.jit(ours.update)(tree, state)
    expected, _ = theirs.update(tree, theirs.init(tree))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=0), clipped,
                 expected)
    norm = float(global_norm(clipped))
    if max_norm < 1:
        np.testing.assert_allclose(norm, max_norm, rtol=1e-5)
    else:
        jax.tree.map(np.testing.assert_array_equal, clipped, tree)


def test_learning_rate_schedule_warms_up_then_decays_to_its_floor():
    """Linear warmup 0 → peak over `warmup_steps`, cosine from the peak to peak·min_lr_ratio at
    `steps`, flat after; a warmup over every step stays finite and ends at the peak."""
    lr = learning_rate_schedule(TrainConfig(steps=100, warmup_steps=10, learning_rate=1e-3,
                                            min_lr_ratio=0.1))
    cosine = lambda t: 1e-4 + 0.5 * 9e-4 * (1 + np.cos(np.pi * (t - 10) / 90))
    for t, expected in {0: 0.0, 5: 5e-4, 10: 1e-3, 40: cosine(40), 55: 5.5e-4, 100: 1e-4,
                        150: 1e-4}.items():
        np.testing.assert_allclose(float(lr(t)), expected, rtol=1e-6, atol=1e-12, err_msg=t)
    whole = learning_rate_schedule(TrainConfig(steps=10, warmup_steps=10, learning_rate=1e-3))
    np.testing.assert_allclose([float(whole(t)) for t in range(11)],
                               np.arange(11) * 1e-4, rtol=1e-6, atol=1e-12)


# `_params()`' leaves that weight decay reaches: the matrices, not the vectors.
DECAYED = {"kernel": True, "embed": True, "bias": False, "scale": False}


def _params():
    rng = np.random.default_rng(3)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    return {"kernel": draw(6, 5), "embed": draw(7, 6), "bias": draw(5), "scale": draw(6)}


def test_weight_decay_reaches_matrices_only():
    """Zero gradients: Adam's own step is 0, so each update is −lr·wd·p on matrices and 0 on
    vectors (norm scales, biases)."""
    config = TrainConfig(steps=10, warmup_steps=0, learning_rate=1e-2, weight_decay=0.5,
                         grad_clip=None)
    params = _params()
    optimizer = make_optimizer(config, scan_layers=False)
    updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), optimizer.init(params),
                                  params)
    for name, p in params.items():
        expected = -1e-2 * 0.5 * p if DECAYED[name] else jnp.zeros_like(p)
        np.testing.assert_allclose(updates[name], expected, rtol=1e-6, atol=1e-12, err_msg=name)
    # Scanned layers stack their blocks' parameters over a leading axis: a `[groups, d]` norm
    # scale is still a vector, a `[groups, d, d']` kernel still a matrix; outside `blocks/`
    # nothing is stacked.
    stacked = {"blocks": {"0": {name: jnp.stack([p, 2 * p]) for name, p in params.items()}},
               **params}
    optimizer = make_optimizer(config, scan_layers=True)
    updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, stacked), optimizer.init(stacked),
                                  stacked)
    for where, tree, got in (("stacked ", stacked["blocks"]["0"], updates["blocks"]["0"]),
                             ("", params, updates)):
        for name, p in tree.items():
            expected = -1e-2 * 0.5 * p if DECAYED[name] else jnp.zeros_like(p)
            np.testing.assert_allclose(got[name], expected, rtol=1e-6, atol=1e-12,
                                       err_msg=where + name)


@pytest.mark.parametrize("grad_clip", [None, 1.0])
def test_optimizer_matches_optax_chain(grad_clip):
    """Three steps with gradient norms of 100, 0.1 and 1: our chain against optax's clipping
    and AdamW (decay masked by hand), with and without clipping; the two differ (Adam's
    moments remember the unclipped first step)."""
    config = TrainConfig(steps=20, warmup_steps=2, learning_rate=1e-2, weight_decay=0.1,
                         grad_clip=grad_clip)
    reference = optax.chain(
        *([optax.clip_by_global_norm(grad_clip)] if grad_clip else []),
        optax.adamw(learning_rate_schedule(config), b1=config.beta1, b2=config.beta2,
                    weight_decay=config.weight_decay, mask=DECAYED))
    params = _params()
    grads = []
    for seed, norm in ((10, 100.0), (11, 0.1), (12, 1.0)):
        g = jax.tree.map(lambda p, s=seed: jax.random.normal(jax.random.key(s), p.shape), params)
        scale = norm / global_norm(g)
        grads.append(jax.tree.map(lambda x, scale=scale: x * scale, g))

    def run(optimizer):
        p, state = params, optimizer.init(params)
        for g in grads:
            updates, state = optimizer.update(g, state, p)
            p = optax.apply_updates(p, updates)
        return p

    ours = run(make_optimizer(config, scan_layers=False))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), ours,
                 run(reference))
    other = run(make_optimizer(dataclasses.replace(config, grad_clip=None if grad_clip else 1.0),
                               scan_layers=False))
    assert not np.allclose(ours["kernel"], other["kernel"], rtol=1e-3, atol=0)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_ssm_decay_rates_never_decay_whatever_their_shape(scan_layers):
    """Mamba-1's A_log is `[d_inner, state]`, a matrix by its shape but an SSM parameter
    (A = −exp(A_log)) like Mamba-2's `[heads]` one: decay pulled every A towards −1. Its
    projection `dt_proj` (`[rank, d_inner]`) still decays."""
    model = hj.create_model(hj.ModelConfig(layers=("mamba1",) * 2, d_model=16, vocab_size=16,
                                           scan_layers=scan_layers))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    config = TrainConfig(steps=10, warmup_steps=0, learning_rate=1e-2, weight_decay=0.5,
                         grad_clip=None)
    optimizer = make_optimizer(config, scan_layers=scan_layers)
    updates, _ = jax.jit(optimizer.update)(jax.tree.map(jnp.zeros_like, params),
                                           optimizer.init(params), params)
    mixer, got = params["blocks"][0]["mixer"], updates["blocks"][0]["mixer"]
    assert mixer["A_log"].ndim == 2 + scan_layers
    np.testing.assert_array_equal(got["A_log"], 0.0)
    np.testing.assert_allclose(got["dt_proj"], -1e-2 * 0.5 * mixer["dt_proj"], rtol=1e-6)


def test_clipping_reads_the_gradient_of_the_trained_parameters_only():
    """A frozen parameter's gradient is not part of the norm that clipping compares with
    `grad_clip`: else a large one (here 100, then 0) shrank the trained parameters' steps,
    which equal those of an optimizer that never saw the frozen parameter."""
    config = TrainConfig(steps=20, warmup_steps=0, learning_rate=1e-2, weight_decay=0.1,
                         grad_clip=1.0)
    params = _params()
    trained = {k: v for k, v in params.items() if k != "embed"}
    grads = [{**jax.tree.map(lambda p: 0.1 * jnp.ones_like(p), trained),
              "embed": frozen * jnp.ones_like(params["embed"])} for frozen in (100.0, 0.0)]

    def run(optimizer, params, grads):
        state = optimizer.init(params)
        for g in grads:
            updates, state = optimizer.update({k: g[k] for k in params}, state, params)
            params = optax.apply_updates(params, updates)
        return params

    ours = run(make_optimizer(dataclasses.replace(config, freeze="^embed"), scan_layers=False),
               params, grads)
    np.testing.assert_array_equal(ours["embed"], params["embed"])
    expected = run(make_optimizer(config, scan_layers=False), trained, grads)
    for name, p in expected.items():
        np.testing.assert_allclose(ours[name], p, rtol=1e-6, err_msg=name)
