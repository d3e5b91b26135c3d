"""A model under a mesh with explicit axes (`jax.make_mesh`'s default) gives the one-device
logits, gradients, decode steps and generated tokens, its outputs typed by the inputs' layout
(`hybrid_jax.sharding.on_automatic_axes`). Without it each of these stopped in JAX's sharding
type checks (the embedding gather, the loss head's custom VJP, a scan's zero initial state)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from hybrid_jax import create_model, presets
from hybrid_jax.generate import generate
from hybrid_jax.nn import diagnostics
from tests.helpers import assert_close

# Attention, GDN, Mamba-2, NHA (GSA is its window 0) and PHA (GSS, the parallel block): the
# wrapper is the model's, so the mixers inside run as on any automatic mesh (tests/test_sharding
# .py, tests/nn/test_inside_shard_map.py); Oryx and GSA are left out for CI time.
PRESETS = ("gdn-hybrid-tiny", "mamba2-hybrid-tiny", "nha-hybrid-tiny", "pha-tiny")
TOKENS = np.random.default_rng(0).integers(0, 200, (4, 16)).astype(np.int32)


def _mesh():
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)  # JAX's default
    return mesh


def _row_sharded(x):
    """`x` split over `data` along its first axis where it divides, else replicated."""
    even = np.ndim(x) and np.shape(x)[0] % 2 == 0
    return jax.device_put(x, P("data") if even else P())


@pytest.mark.parametrize("name", PRESETS)
def test_training_and_decoding_match_one_device(name):
    model = create_model(presets.get(name), seed=0)
    graphdef, state = nnx.split(model)
    loss_and_grad = jax.jit(jax.value_and_grad(
        lambda state, tokens: jnp.mean(nnx.merge(graphdef, state)(tokens) ** 2)))
    prefill = jax.jit(lambda tokens, cache: model.decode(tokens, cache, fresh_cache=True))
    step = jax.jit(model.decode)
    loss, grads = loss_and_grad(state, TOKENS)
    logits, cache = prefill(TOKENS[:, :-1], model.init_cache(4, 16))
    next_logits, _ = step(TOKENS[:, -1:], cache)
    with jax.set_mesh(_mesh()):
        # Parameters split explicitly too: they enter as arguments, not closed over.
        e_loss, e_grads = loss_and_grad(jax.tree.map(_row_sharded, state),
                                        _row_sharded(TOKENS))
        e_logits, e_cache = prefill(_row_sharded(TOKENS[:, :-1]), model.init_cache(4, 16))
        e_next, _ = step(_row_sharded(TOKENS[:, -1:]), e_cache)
    assert_close(e_loss, loss, 1e-6, "loss")
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(e_grads),
                                 jax.tree.leaves(grads), strict=True):
        assert_close(got, want, 1e-5, jax.tree_util.keystr(path))
    # Outputs typed as the inputs lie: logits by rows, the cache as it came (replicated).
    assert jax.typeof(e_logits).sharding.spec == P("data", None, None)
    assert all(jax.typeof(x).sharding.spec == P(*[None] * x.ndim)
               for x in jax.tree.leaves(e_cache))
    assert_close(e_logits, logits, 1e-5, "prefill logits")
    assert_close(e_next, next_logits, 1e-5, "decode step logits")


def test_generation_matches_one_device():
    model = create_model(presets.get("gdn-hybrid-tiny"), seed=0)
    want = generate(model, TOKENS[:, :6], 5, temperature=0.7, seed=3)
    with jax.set_mesh(_mesh()):
        got = generate(model, _row_sharded(TOKENS[:, :6]), 5, temperature=0.7, seed=3)
    assert jax.typeof(got).sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_recorded_diagnostics_refuse_explicit_axes_by_name():
    """The trainer records on its own automatic mesh; a caller's explicit one is refused rather
    than reports lost."""
    model = create_model(presets.get("pha-tiny"), seed=0)
    with jax.set_mesh(_mesh()), pytest.raises(ValueError, match=r"explicit axes \('data',\)"):
        diagnostics.recorded(lambda m: m(_row_sharded(TOKENS)), model)


def test_inside_a_shard_map_over_some_of_the_explicit_axes():
    """Manual over `data`, `x` still explicit inside: only `x` turns automatic (JAX refuses to
    make a manual axis automatic). Replicated parameters' gradients come back summed over the
    `data` shards (autodiff's transpose of their broadcast), twice the one-device mean's."""
    graphdef, state = nnx.split(create_model(presets.get("transformer-tiny"), seed=0))
    loss = jax.grad(lambda state, tokens: jnp.mean(nnx.merge(graphdef, state)(tokens) ** 2))
    want = loss(state, TOKENS)
    mesh = jax.make_mesh((2, 2), ("data", "x"), devices=jax.devices()[:4])
    with jax.set_mesh(mesh):
        got = jax.jit(jax.shard_map(loss, in_specs=(P(), P("data")), out_specs=P(),
                                    axis_names={"data"}))(state, _row_sharded(TOKENS))
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want),
                            strict=True):
        assert_close(g / 2, w, 1e-5, jax.tree_util.keystr(path))


@pytest.mark.parametrize("name", ["gdn-hybrid-tiny", "pha-tiny"])
def test_a_block_on_its_own_matches_one_device(name):
    """A user's own model built of the library's blocks: each block runs on automatic axes
    too, its output and cache typed as its input and cache came."""
    from hybrid_jax.context import TokenContext

    model = create_model(presets.get(name), seed=0)
    # A random projection of the output: PHA's post-norm output has a fixed sum of squares.
    x, r = np.random.default_rng(1).normal(size=(2, 4, 16, model.config.d_model)).astype(
        np.float32)
    ctx = TokenContext.create((4, 16))
    for block in model.blocks:
        graphdef, state = nnx.split(block)
        forward = jax.jit(jax.value_and_grad(
            lambda state, x, graphdef=graphdef: jnp.sum(nnx.merge(graphdef, state)(x, ctx) * r)))
        step = jax.jit(lambda x, cache, block=block: block.decode(x, cache,
                                                                  TokenContext.create((4, 1))))
        want, want_grads = forward(state, x)
        want_step = step(x[:, :1], block.init_cache(4, 8, jnp.float32))
        with jax.set_mesh(_mesh()):
            got, got_grads = forward(jax.tree.map(_row_sharded, state), _row_sharded(x))
            got_step = step(_row_sharded(x[:, :1]), block.init_cache(4, 8, jnp.float32))
        assert_close(got, want, 1e-5, "block output")
        for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
            assert_close(g, w, 1e-5, "block gradient")
        assert jax.typeof(got_step[0]).sharding.spec == P("data", None, None)
        for g, w in zip(jax.tree.leaves(got_step), jax.tree.leaves(want_step), strict=True):
            assert_close(g, w, 1e-5, "block decode step")
