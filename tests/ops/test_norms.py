"""The norms op (`ops.rms_norm`, `ops.gated_rms_norm`): the XLA rung is the float32 math the
layers always had (values, and only the inputs kept for the backward); auto takes the kernels
on a GPU and logs a fallback to XLA with its reason, a named `implementation="pallas"` takes
them; the layers pass their `implementation` through (end to end in interpret mode on the CPU,
and lowered for a GPU); bad inputs are named."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import ops
from hybrid_jax.nn.layers import GatedRMSNorm, RMSNorm
from hybrid_jax.ops import dispatch, norms
from pallas_kernels.rms_norm import api
from tests.helpers import assert_close, normals
from tests.nn.test_gated_deltanet import rms, silu

SPEC = jax.ShapeDtypeStruct
KW = dict(group_size=512, norm_before_gate=True, eps=1e-6, dtype="bfloat16")


def test_xla_rung_is_the_layers_float32_math():
    """Bit for bit the expressions the layers computed before the op (values, under jit)."""
    x, z, g = normals(0, (2, 5, 12), (2, 5, 12), (12,), dtype=np.float32)
    x = x.astype(jnp.bfloat16)
    plain = jax.jit(lambda x, g: ops.rms_norm(x, g, eps=1e-5, dtype=jnp.bfloat16))(x, g)
    x32 = x.astype(jnp.float32)
    expected = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5) * g)
    np.testing.assert_array_equal(plain, jax.jit(lambda e: e.astype(jnp.bfloat16))(expected))
    for before in (True, False):
        y = ops.gated_rms_norm(x, z, g, group_size=4, norm_before_gate=before,
                               implementation="xla")
        gate = jax.nn.silu(z)
        a = (x32 if before else x32 * gate).reshape(2, 5, 3, 4)
        ref = (a * jax.lax.rsqrt(jnp.mean(a * a, -1, keepdims=True) + 1e-6)).reshape(x.shape) * g
        assert y.dtype == jnp.bfloat16
        assert_close(y, (ref * gate if before else ref), 1e-2, f"before={before}")


def test_eps_sits_inside_the_root():
    """Inputs of RMS 1e-3, where ε = 1e-6 is as large as mean(x²): its place and size show
    (at O(1) inputs a tenfold ε moves the output by 5e-6, inside the other tests' tolerances)."""
    x, z = (1e-3 * a for a in normals(3, (2, 5, 8), (2, 5, 8), dtype=np.float32))
    expected = rms(np.asarray(x, np.float64), 1e-6)
    ones = jnp.ones((8,), jnp.float32)
    assert_close(ops.rms_norm(x, ones, eps=1e-6, dtype=jnp.float32), expected, 1e-5)
    gated = ops.gated_rms_norm(x, z, ones, eps=1e-6, dtype=jnp.float32, implementation="xla")
    assert_close(gated, expected * silu(np.asarray(z, np.float64)), 1e-5, "gated")


def test_auto_takes_the_kernels_on_a_gpu_and_logs_a_fallback(monkeypatch, caplog):
    """On the CPU auto is the XLA rung without a word; on a GPU the kernels, and the XLA rung
    with a logged reason where they cannot run (a group wider than one program)."""
    x, z, g = SPEC((4, 8192, 3, 512), jnp.bfloat16), SPEC((4, 8192, 3, 512), jnp.bfloat16), \
        SPEC((512,), jnp.float32)
    rungs = norms._RUNGS
    assert dispatch.choose("gated_rms_norm", rungs, None, x, z, g, **KW) == (rungs[1], [])
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert dispatch.choose("gated_rms_norm", rungs, None, x, z, g, **KW) == (rungs[0], [])
    wide = SPEC((2, 8, 2 * api.MAX_GROUP), jnp.bfloat16)
    scale = SPEC((2 * api.MAX_GROUP,), jnp.float32)
    dispatch._LOGGED.clear()
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.dispatch"):
        jax.eval_shape(lambda x, g: ops.rms_norm(x, g), wide, scale)
    assert "ran the xla rung" in caplog.text and "group_size must be at most" in caplog.text


def test_named_pallas_refuses_on_the_cpu():
    x, g = jnp.zeros((2, 3, 8)), jnp.ones(8)
    with pytest.raises(ValueError, match="implementation='pallas' cannot run this call: the "
                                         "kernels run on GPUs"):
        ops.rms_norm(x, g, implementation="pallas")


@pytest.fixture
def interpreted(monkeypatch):
    """The "pallas" rung runs the kernels in interpret mode (on the CPU)."""
    monkeypatch.setattr(api, "rms_norm", functools.partial(api.rms_norm, interpret=True))
    monkeypatch.setattr(api, "unsupported", functools.partial(api.unsupported, interpret=True))


@pytest.mark.parametrize("before", [True, False, None])
def test_layers_take_the_kernels(interpreted, before):
    """`RMSNorm` / `GatedRMSNorm(implementation="pallas")`: the values and gradients (x, z, γ)
    of the XLA rung's layer, bf16 activations, float32 γ."""
    x, z = normals(3, (2, 7, 3, 8), (2, 7, 3, 8), dtype=jnp.bfloat16)
    dy = normals(4, (2, 7, 3, 8), dtype=jnp.bfloat16)
    make = lambda impl: (RMSNorm(8, dtype=jnp.bfloat16, implementation=impl) if before is None
                         else GatedRMSNorm(8, norm_before_gate=before, dtype=jnp.bfloat16,
                                           implementation=impl))
    results = []
    for impl in ("pallas", "xla"):
        layer = make(impl)
        layer.scale[...] = 1.0 + 0.1 * jnp.arange(8.0)
        graphdef, params = nnx.split(layer)

        def fn(x, z, params, graphdef=graphdef):
            layer = nnx.merge(graphdef, params)
            return layer(x) if before is None else layer(x, z)
        y, vjp = jax.vjp(fn, x, z, params)
        results.append((y, vjp(dy)))
    (y, grads), (y_xla, grads_xla) = results
    assert y.dtype == jnp.bfloat16
    assert_close(y, y_xla, 1e-2, "values")
    assert_close(grads, grads_xla, 1e-2, "gradients")


def test_layer_lowers_to_the_kernels_for_a_gpu(monkeypatch):
    """gdn-340m's output norm with `implementation="pallas"` builds both Triton kernels."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    norm = GatedRMSNorm(512, dtype=jnp.bfloat16, implementation="pallas")
    spec = SPEC((4, 8192, 3, 512), jnp.bfloat16)
    grads = jax.grad(lambda x, z: jnp.sum(norm(x, z).astype(jnp.float32)), argnums=(0, 1))
    text = jax.jit(grads).trace(spec, spec).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 2


def test_op_checks_its_inputs():
    x, g = jnp.zeros((2, 3, 8)), jnp.ones(8)
    with pytest.raises(ValueError, match=r"rms_norm: scale must have shape \[C\] = \[8\] "
                                         r"\(x's last axis, x shape \(2, 3, 8\)\), got \(6,\)"):
        ops.rms_norm(x, jnp.ones(6))
    with pytest.raises(ValueError, match=r"z must have x's shape \(2, 3, 8\), got \(2, 3, 4\)"):
        ops.gated_rms_norm(x, jnp.zeros((2, 3, 4)), g)
    with pytest.raises(ValueError, match=r"group_size=3 does not divide the channels C=8"):
        ops.gated_rms_norm(x, x, g, group_size=3)
    with pytest.raises(ValueError, match="z must be a floating-point array, got dtype int32"):
        ops.gated_rms_norm(x, x.astype(jnp.int32), g)
    with pytest.raises(ValueError, match=r"implementation='cudnn' is not available"):
        ops.rms_norm(x, g, implementation="cudnn")
    # an integer output dtype rounded y; a float group size failed in a reshape
    with pytest.raises(ValueError, match="rms_norm: dtype must be a floating-point dtype, got "
                                         "int32"):
        ops.rms_norm(x, g, dtype=jnp.int32)
    with pytest.raises(ValueError, match="group_size must be an int >= 1, got 4.0"):
        ops.gated_rms_norm(x, x, g, group_size=4.0)
