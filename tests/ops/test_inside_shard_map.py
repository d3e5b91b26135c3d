"""Each recurrent op's XLA rungs inside a caller's data-parallel `jax.shard_map` (`check_vma`
on, its default): outputs, final states and the gradients of every input equal one device's
(float32). The loops start from zero states, or from an initial state replicated on every
device, that their per-device inputs make vary (`pallas_kernels.vma`); replicated parameters
(SSD's A, the DSS kernel's) get their gradients summed over the devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.ops.selective_scan import selective_scan
from hybrid_jax.sharding import make_mesh
from tests.helpers import assert_close, normals

B, T, H = 4, 12, 2
IDS = jnp.asarray(np.repeat([[0] * 5 + [1] * 7], B, axis=0), jnp.int32)


def _decays(seed, shape):
    return -jnp.exp(normals(seed, shape, dtype=np.float32)) * 0.3


def delta_rule(implementation):
    q, k, v, beta = normals(1, (B, T, H, 4), (B, T, H, 4), (B, T, H, 4), (B, T, H),
                            dtype=np.float32)
    args = dict(q=q, k=k / jnp.linalg.norm(k, axis=-1, keepdims=True), v=v,
                g=_decays(2, (B, T, H)), beta=jax.nn.sigmoid(beta))
    return lambda a, ids: ops.gated_delta_rule(
        a["q"], a["k"], a["v"], a["g"], a["beta"], segment_ids=ids, chunk_size=4,
        return_final_state=True, implementation=implementation), args, set()


def ssd(implementation):
    x, dt, a, b, c, s0 = normals(3, (B, T, H, 4), (B, T, H), (H,), (B, T, 1, 4), (B, T, 1, 4),
                                 (H, 4, 4), dtype=np.float32)
    args = dict(x=x, dt=jax.nn.softplus(dt), A=-jnp.exp(a), B=b, C=c, state=s0)
    # One initial state for every row, replicated on the devices.
    return lambda a, ids: ops.ssd(
        a["x"], a["dt"], a["A"], a["B"], a["C"], segment_ids=ids, chunk_size=4,
        initial_state=jnp.broadcast_to(a["state"], a["x"].shape[:1] + a["state"].shape),
        return_final_state=True, implementation=implementation), args, {"A", "state"}


def selective(implementation):
    x, dt, a, b, c = normals(4, (B, T, H, 3), (B, T, H, 3), (H, 3, 4), (B, T, 1, 4),
                             (B, T, 1, 4), dtype=np.float32)
    args = dict(x=x, dt=jax.nn.softplus(dt), A=-jnp.exp(a), B=b, C=c)
    return lambda a, ids: selective_scan(
        a["x"], a["dt"], a["A"], a["B"], a["C"], segment_ids=ids, chunk_size=4,
        return_final_state=True, implementation=implementation), args, {"A"}


def dss(implementation):
    u, log_dt, re, im = normals(5, (B, T, H), (H,), (H, 4), (H, 4), dtype=np.float32)
    args = dict(u=u, log_dt=log_dt - 1.0, re=re - 0.7, im=im)

    def run(a, ids):
        log_decay, coeff = ops.dss_discretize(a["log_dt"], a["re"], a["im"],
                                              jnp.ones((H, 4)), jnp.zeros((H, 4)))
        y, final = ops.dss(a["u"], log_decay, coeff, segment_ids=ids, chunk_size=4,
                           return_final_state=True, implementation=implementation)
        return y, jnp.abs(final)
    return run, args, {"log_dt", "re", "im"}


def gsa(implementation):
    q, k, v, f = normals(6, (B, T, H, 4), (B, T, H, 4), (B, T, H, 4), (B, T, H, 4),
                         dtype=np.float32)
    g = jax.nn.log_sigmoid(f)
    args = dict(q=q, k=k, v=v, s=1 - jnp.exp(g), g=g)
    def run(a, ids):
        out, (keys, values) = ops.gated_slot_attention(
            a["q"], a["k"], a["v"], a["s"], a["g"], segment_ids=ids, chunk_size=4,
            return_final_state=True, implementation=implementation)
        return out, keys, values
    return run, args, set()


def nha(implementation):
    q, k, v, f = normals(7, (B, T, H, 4), (B, T, 1, 4), (B, T, 1, 4), (B, T, 1, 4),
                         dtype=np.float32)
    g = jax.nn.log_sigmoid(f)
    args = dict(q=q, k=k, v=v, s=1 - jnp.exp(g), g=g)

    def run(a, ids):
        out, state = ops.native_hybrid_attention(
            a["q"], a["k"], a["v"], a["s"], a["g"], window=3, segment_ids=ids, chunk_size=4,
            return_final_state=True, implementation=implementation)
        return out, state.slot_keys, state.slot_values
    return run, args, set()


CASES = {(name, rung): functools.partial(case, rung)
         for name, case, rungs in [
             ("gated_delta_rule", delta_rule, ("xla", "reference")),
             ("ssd", ssd, ("xla", "reference")),
             ("selective_scan", selective, ("xla", "reference")),
             ("dss", dss, ("xla", "scan", "reference")),
             ("gated_slot_attention", gsa, ("xla", "reference")),
             ("native_hybrid_attention", nha, ("xla", "reference"))]
         for rung in rungs}


@pytest.mark.parametrize("name,rung", sorted(CASES), ids=[f"{n}-{r}" for n, r in sorted(CASES)])
def test_rung_in_a_data_parallel_shard_map(name, rung):
    run, args, replicated = CASES[name, rung]()

    def values_and_grads(args, weights, ids):
        def loss(args):
            out = run(args, ids)
            return sum(jnp.sum(x * w) for x, w in zip(out, weights, strict=True)), out
        (_, out), grads = jax.value_and_grad(loss, has_aux=True)(args)
        return out, grads

    shapes = jax.eval_shape(run, args, IDS)
    weights = normals(9, *(x.shape for x in shapes), dtype=np.float32)
    expected = jax.jit(values_and_grads)(args, weights, IDS)
    rows = P("data")  # every output, final states included, has the batch first
    specs = {n: P() if n in replicated else rows for n in args}
    with jax.set_mesh(make_mesh(MeshConfig(data=2), jax.devices()[:2])):
        got = jax.jit(jax.shard_map(values_and_grads, in_specs=(specs, rows, rows),
                                    out_specs=(rows, specs)))(args, weights, IDS)
    assert_close(got[0], expected[0], 1e-5, f"{name} {rung} outputs")
    assert_close(got[1], expected[1], 1e-4, f"{name} {rung} gradients")
