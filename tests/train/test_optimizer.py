"""`global_norm` (small leaves reduced together) and the clipping built on it, against float64
numpy and optax's own `clip_by_global_norm`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from hybrid_jax.train.optimizer import SMALL_LEAF, clip_by_global_norm, global_norm


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
