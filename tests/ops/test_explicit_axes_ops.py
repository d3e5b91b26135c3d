"""Every public op called on its own under a mesh with explicit axes (`jax.make_mesh`'s default)
gives the values and gradients it gives without a mesh, its outputs typed like its inputs
(`hybrid_jax.ops.explicit_axes.typed_like_inputs`). Without the wrapper the recurrences stopped
in JAX's sharding type checks (GDN's chunk products, GSA's selects, NHA's concatenates, SSD's
and the norms' per-channel products)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from hybrid_jax import ops
from hybrid_jax.ops.selective_scan import selective_scan, selective_scan_step
from tests.helpers import assert_close

B, T, H, K, V, M, N = 4, 9, 4, 8, 8, 4, 4
RNG = np.random.default_rng(0)


def _normal(*shape):
    return jnp.asarray(RNG.normal(size=shape), jnp.float32)


def _unit(*shape):
    return ops.l2_normalize(_normal(*shape))


def _log_gate(*shape):
    return jax.nn.log_sigmoid(_normal(*shape)) / 4


SEGMENTS = jnp.asarray(np.repeat([[0] * 4 + [1] * 5], B, 0), jnp.int32)
GATE = _log_gate(B, T, H, M)
LOG_DECAY, COEFF = ops.dss_discretize(_normal(H) - 3, _normal(N), _normal(N), _normal(H, N),
                                      _normal(H, N))
NHA_STATE = jax.tree.map(  # slots and ring entries not empty; the lengths stay integers
    lambda x: x + 0.1 * _normal(*x.shape) if jnp.issubdtype(x.dtype, jnp.floating) else x,
    ops.nha_empty_state(B, H, K, V, M, 3))

# name: (op with its static arguments, arrays; the first is the batch-major activation).
CASES = {
    "attention": (lambda q, k, v, ids: ops.attention(q, k, v, causal=True, segment_ids=ids),
                  (_normal(B, T, H, K), _normal(B, T, 2, K), _normal(B, T, 2, V), SEGMENTS)),
    "scaled_cosine_attention": (
        lambda q, k, v, t: ops.scaled_cosine_attention(q, k, v, t, causal=True),
        (_normal(B, T, H, K), _normal(B, T, H, K), _normal(B, T, H, V), _normal(H))),
    "gated_delta_rule": (
        lambda q, k, v, g, b, s, ids: ops.gated_delta_rule(
            q, k, v, g, b, initial_state=s, segment_ids=ids, return_final_state=True),
        (_unit(B, T, H, K), _unit(B, T, H, K), _normal(B, T, H, V),
         -jax.nn.softplus(_normal(B, T, H)), jax.nn.sigmoid(_normal(B, T, H)),
         _normal(B, H, K, V), SEGMENTS)),
    "gated_delta_rule_step": (
        ops.gated_delta_rule_step,
        (_normal(B, H, K, V), _unit(B, H, K), _unit(B, H, K), _normal(B, H, V),
         -jax.nn.softplus(_normal(B, H)), jax.nn.sigmoid(_normal(B, H)))),
    "gated_slot_attention": (
        lambda q, k, v, s, g, ids: ops.gated_slot_attention(
            q, k, v, s, g, segment_ids=ids, return_final_state=True),
        (_normal(B, T, H, K), _normal(B, T, H, K), _normal(B, T, H, V), 1 - jnp.exp(GATE), GATE,
         SEGMENTS)),
    "gated_slot_attention_step": (
        lambda sk, sv, q, k, v, s, g: ops.gated_slot_attention_step((sk, sv), q, k, v, s, g),
        (_normal(B, H, K, M), _normal(B, H, M, V), _normal(B, H, K), _normal(B, H, K),
         _normal(B, H, V), 1 - jnp.exp(GATE[:, 0]), GATE[:, 0])),
    "gsa_slot_logits": (
        lambda q, k, s, g: ops.gsa_slot_logits(q, k, s, g, delay=2),
        (_normal(B, T, H, K), _normal(B, T, H, K), 1 - jnp.exp(GATE), GATE)),
    "gsa_slot_readout": (
        lambda p, v, s, g: ops.gsa_slot_readout(p, v, s, g, return_final_state=True),
        (jax.nn.softmax(_normal(B, T, H, M)), _normal(B, T, H, V), 1 - jnp.exp(GATE), GATE)),
    "native_hybrid_attention": (
        lambda q, k, v, s, g, ids: ops.native_hybrid_attention(
            q, k, v, s, g, window=3, segment_ids=ids, return_final_state=True),
        # (GQA here, heads split over `tensor`: XLA's partitioner fails on the final state's
        # gradient inside auto_axes, "hlo verifier: shape does not match" in a while loop)
        (_normal(B, T, H, K), _normal(B, T, H, K), _normal(B, T, H, V), 1 - jnp.exp(GATE), GATE,
         SEGMENTS)),
    "native_hybrid_attention_step": (
        lambda state, q, k, v, s, g: ops.native_hybrid_attention_step(state, q, k, v, s, g),
        (NHA_STATE, _normal(B, H, K), _normal(B, H, K), _normal(B, H, V),
         1 - jnp.exp(GATE[:, 0]), GATE[:, 0])),
    "ssd": (
        lambda x, dt, a, b, c, ids: ops.ssd(x, dt, a, b, c, segment_ids=ids,
                                            return_final_state=True),
        (_normal(B, T, H, V), jax.nn.softplus(_normal(B, T, H)), -jnp.exp(_normal(H)),
         _normal(B, T, 2, N), _normal(B, T, 2, N), SEGMENTS)),
    "ssd_step": (
        ops.ssd_step,
        (_normal(B, H, V, N), _normal(B, H, V), jax.nn.softplus(_normal(B, H)),
         -jnp.exp(_normal(H)), _normal(B, 2, N), _normal(B, 2, N))),
    "selective_scan": (
        lambda x, dt, a, b, c, ids: selective_scan(x, dt, a, b, c, segment_ids=ids),
        (_normal(B, T, H, V), jax.nn.softplus(_normal(B, T, H, V)), -jnp.exp(_normal(H, V, N)),
         _normal(B, T, 2, N), _normal(B, T, 2, N), SEGMENTS)),
    "selective_scan_step": (
        selective_scan_step,
        (_normal(B, H, V, N), _normal(B, H, V), jax.nn.softplus(_normal(B, H, V)),
         -jnp.exp(_normal(H, V, N)), _normal(B, 2, N), _normal(B, 2, N))),
    "dss": (lambda u, ids: ops.dss(u, LOG_DECAY, COEFF, segment_ids=ids),
            (_normal(B, T, H), SEGMENTS)),
    "dss_step": (lambda state, u: ops.dss_step(state, u, LOG_DECAY, COEFF),
                 ((_normal(B, H, N) + 1j * _normal(B, H, N)).astype(jnp.complex64),
                  _normal(B, H))),
    "short_conv": (
        lambda x, w, ids: ops.short_conv(x, w, segment_ids=ids, activation=True),
        (_normal(B, T, H * V), _normal(4, H * V), SEGMENTS)),
    "rms_norm": (ops.rms_norm, (_normal(B, T, H * V), _normal(H * V))),
    "gated_rms_norm": (lambda x, z, w: ops.gated_rms_norm(x, z, w, group_size=V),
                       (_normal(B, T, H * V), _normal(B, T, H * V), _normal(H * V))),
}


def _split(x):
    """Batch-major arrays split over `data` on their first axis and, `[B, T, H, D]` ones with
    all heads, over `tensor` on the heads; everything else replicated."""
    spec = [None] * x.ndim
    if x.ndim >= 2 and x.shape[0] == B:
        spec[0] = "data"
    if x.ndim == 4 and x.shape[:3] == (B, T, H):
        spec[2] = "tensor"
    return jax.device_put(x, P(*spec))


def _loss(op, *arrays):
    """Σ|out|² over the floating outputs: every output's cotangent reaches the inputs."""
    return sum(jnp.sum(jnp.abs(out) ** 2) for out in jax.tree.leaves(op(*arrays))
               if jnp.issubdtype(out.dtype, jnp.inexact))


@pytest.mark.parametrize("name", CASES)
def test_op_under_explicit_axes_matches_no_mesh(name):
    op, arrays = CASES[name]
    wrt = tuple(i for i, x in enumerate(arrays) if all(
        jnp.issubdtype(leaf.dtype, jnp.floating) for leaf in jax.tree.leaves(x)))
    run = jax.jit(op)
    grads = jax.jit(jax.grad(lambda *a: _loss(op, *a), argnums=wrt))
    want, want_grads = run(*arrays), grads(*arrays)
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), devices=jax.devices()[:4])
    with jax.set_mesh(mesh):
        split = jax.tree.map(_split, arrays)
        got, got_grads = run(*split), grads(*split)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path((got, got_grads)),
                            jax.tree.leaves((want, want_grads)), strict=True):
        assert_close(g, w, 1e-5, name + jax.tree_util.keystr(path))
    # Outputs typed like the inputs: the first output as the first input of its shape (or by
    # its rows), never left to a type JAX could not infer.
    first = jax.tree.leaves(got)[0]
    like = [x for x in jax.tree.leaves(split) if x.shape == first.shape]
    expected = (jax.typeof(like[0]).sharding.spec if like
                else P("data", *[None] * (first.ndim - 1)))
    assert jax.typeof(first).sharding.spec == expected


def test_plain_call_without_explicit_axes():
    """On an automatic mesh (and without one) the op is called as it is: no wrapper traced."""
    op, arrays = CASES["gated_delta_rule"]
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2],
                         axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        jaxpr = jax.make_jaxpr(op)(*arrays)
    assert "auto_axes" not in str(jaxpr) and "mesh_cast" not in str(jaxpr)
