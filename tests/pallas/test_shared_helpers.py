"""The helpers shared by the kernels (`pallas_kernels/*.py`) against plain numpy, directly: the
kernel tests reach them only through kernels whose shapes and masks may not exercise every
branch (a band whose interior is empty, a rocm backend, an integer input in interpret mode)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from pallas_kernels import base2, gpu_elementwise, target, vma
from pallas_kernels.band_loop import band_loop, ceil_div
from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.chunk_sums import chunk_cumsum
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.residuals import KERNEL_RESIDUALS, saved
from tests.helpers import tpu_mesh

MASK_CODES = {None: 1, "full": 2, "causal": 3}


@jax.jit
def _visits(lo, hi, full_lo, full_hi):
    """Per block of [0, 8): the masks it was visited with, base 4 (0 = never visited), for each
    causal_part."""
    def visit(i, carry, mask):
        return carry.at[i].set(4 * carry[i] + MASK_CODES[mask])

    start = jnp.zeros(8, jnp.int32)
    return [band_loop(lo, hi, full_lo, full_hi, visit, start, part)
            for part in (None, "last", "first")]


def _expected_mask(i, full_lo, full_hi, part):
    if full_lo <= i < full_hi:
        return None
    if part == "last" and i >= full_lo and i >= full_hi:  # after the interior
        return "causal"
    if part == "first" and i < full_lo and i < full_hi:  # before it, still below the diagonal
        return "causal"
    return "full"


def test_band_loop_visits_each_band_block_once_with_its_mask():
    """Every band, interior inside, overlapping, outside, empty or inverted: each block of
    [lo, hi) once, no block outside it, mask None exactly on [full_lo, full_hi) ∩ band."""
    for lo, hi, full_lo, full_hi in itertools.product(range(3), range(7), range(-1, 8),
                                                      range(-1, 8)):
        if hi < lo:
            continue
        got = _visits(*(jnp.int32(v) for v in (lo, hi, full_lo, full_hi)))
        for part, visits in zip((None, "last", "first"), got, strict=True):
            want = [MASK_CODES[_expected_mask(i, full_lo, full_hi, part)] if lo <= i < hi
                    else 0 for i in range(8)]
            np.testing.assert_array_equal(
                visits, want, err_msg=f"band [{lo}, {hi}) interior [{full_lo}, {full_hi}) {part}")


def test_ceil_div():
    x = jnp.arange(50, dtype=jnp.int32)
    for block in (1, 3, 16):
        np.testing.assert_array_equal(ceil_div(x, block), -(-np.arange(50) // block))


def test_base2_exp_is_e_to_the_x():
    x = np.random.default_rng(0).uniform(-60, 60, 101).astype(np.float32)
    np.testing.assert_allclose(base2.exp(jnp.asarray(x)), np.exp(x.astype(np.float64)),
                               rtol=1e-5)
    assert base2.exp(jnp.float32(-jnp.inf)) == 0
    np.testing.assert_allclose(base2.LOG2E, 1 / np.log(2), rtol=1e-15)


@pytest.mark.parametrize("C", [1, 4, 12])
def test_chunk_cumsum_restarts_at_each_chunk(C):
    x = np.random.default_rng(C).standard_normal((2, 3, 12)).astype(np.float32)
    want = np.zeros_like(x)
    for t in range(12):
        start = t - t % C
        want[..., t] = x[..., start:t + 1].sum(-1)
    np.testing.assert_allclose(chunk_cumsum(jnp.asarray(x), C), want, rtol=1e-5, atol=1e-6)


def test_sigmoid_and_iota():
    z = np.random.default_rng(1).uniform(-30, 30, 77).astype(np.float32)
    np.testing.assert_allclose(gpu_elementwise.sigmoid(jnp.asarray(z)), 1 / (1 + np.exp(-z)),
                               rtol=1e-5, atol=1e-7)
    rows, cols = np.indices((3, 5))
    np.testing.assert_array_equal(gpu_elementwise.iota((3, 5), 0), rows)
    np.testing.assert_array_equal(gpu_elementwise.iota((3, 5), 1), cols)


@dataclasses.dataclass(frozen=True)
class _Blocks(gpu_elementwise.TileChecks):
    TILES = ("tile",)
    COUNTS = ("count",)
    MIN_TILE = 4
    tile: int = 8
    count: int = 2
    other: int = 0


def test_tile_checks():
    assert _Blocks(tile=4, count=1).changed() == {"tile": 4, "count": 1}
    assert _Blocks(other=3).changed() == {"other": 3}
    assert _Blocks().changed() == {}
    for tile in (2, 6, 12, 0):
        message = f"BlockSizes.tile must be a power of two >= 4, got {tile}"
        with pytest.raises(ValueError, match=message):
            _Blocks(tile=tile)
    with pytest.raises(ValueError, match="BlockSizes.count must be >= 1, got 0"):
        _Blocks(count=0)


def test_unsupported_arrays(monkeypatch):
    check = gpu_elementwise.unsupported_arrays
    f64, bf16 = np.zeros(2, np.float64), jnp.zeros(2, jnp.bfloat16)
    ints = jnp.zeros(2, jnp.int32)
    assert "x must be floating, got int32" in check({"y": None, "x": ints}, interpret=True)
    assert check({"x": f64, "y": None}, interpret=True) is None
    assert "target platform is cpu" in check({"x": bf16}, interpret=False)
    monkeypatch.setattr(target, "platform", lambda: "tpu")
    assert "target platform is tpu" in check({"x": bf16}, interpret=False)
    monkeypatch.setattr(target, "platform", lambda: "gpu")
    assert check({"x": bf16, "y": None}, interpret=False) is None
    with jax.enable_x64(True):
        assert "y has dtype float64" in check({"x": bf16, "y": jnp.zeros(2)}, interpret=False)


def test_matmuls_accumulate_in_float32_in_each_orientation():
    rng = np.random.default_rng(2)
    a, b_t, b = (rng.standard_normal(shape) for shape in [(3, 40), (5, 40), (40, 5)])
    for dtype in (jnp.float32, jnp.bfloat16):
        x, y, y_t = (jnp.asarray(v, dtype) for v in (a, b, b_t))
        exact = lambda v: np.asarray(v.astype(jnp.float32), np.float64)
        for got, want in [(mm(x, y), exact(x) @ exact(y)),
                          (mm_nt(x, y_t), exact(x) @ exact(y_t).T),
                          (mm_tn(x.T, y), exact(x) @ exact(y))]:
            assert got.dtype == jnp.float32
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_target_platform(monkeypatch):
    for backend, platform in [("cuda", "gpu"), ("rocm", "gpu"), ("cpu", "cpu"), ("tpu", "tpu")]:
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        assert target.platform() == platform
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    with jax.sharding.use_abstract_mesh(tpu_mesh()):
        assert target.platform() == "tpu"


def test_saved_tags_array_leaves_as_kernel_residuals():
    jaxpr = jax.make_jaxpr(lambda x, y: saved((x, None), {"y": y}))(jnp.ones(2), jnp.ones(3))
    names = [e.params["name"] for e in jaxpr.eqns if e.primitive.name == "name"]
    assert names == [KERNEL_RESIDUALS, KERNEL_RESIDUALS]
    x, y = jnp.ones(2), jnp.zeros(3)
    out = saved((x, None), {"y": y})
    assert out[0][1] is None and np.array_equal(out[0][0], x) and np.array_equal(out[1]["y"], y)


def _mesh():
    return jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


def test_vma_helpers_inside_shard_map():
    """Axes of a mix of replicated and per-device leaves; a replicated state made to vary like
    per-device inputs; a replicated weight's cotangent summed over the devices."""
    def body(rows, weight):
        assert vma.varying_axes(weight) == frozenset()
        assert vma.varying_axes((weight, [rows, None])) == {"x"}
        assert vma.varying_axes([rows, weight]) == {"x"}
        state = vma.varying_like(jnp.zeros(3), weight, rows)
        assert vma.varying_axes(state) == {"x"}
        assert vma.varying_like(state, rows) is state
        assert vma.varying_axes(vma.varying_like(weight, weight)) == frozenset()
        cotangent = vma.cotangent_for(rows * weight, weight)
        assert vma.varying_axes(cotangent) == frozenset()
        return cotangent, vma.cotangent_for(rows, rows)

    fn = jax.shard_map(body, mesh=_mesh(), in_specs=(P("x"), P()), out_specs=(P(), P("x")))
    rows = jnp.arange(6.0).reshape(2, 3)
    summed, own = jax.jit(fn)(rows, jnp.full((1, 3), 2.0))
    np.testing.assert_array_equal(summed, 2 * rows.sum(0, keepdims=True))
    np.testing.assert_array_equal(own, rows)


def test_pallas_call_outputs_vary_like_their_inputs():
    """Inside shard_map a kernel's outputs vary over its inputs' axes (which the kernels make
    agree, `vma.varying_like`), outside it over none. Traced only: the interpreter does not
    run under `check_vma` (tests/ops/test_partition.py's `vma_off`)."""
    def add(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...] + w_ref[...]

    call = lambda x, w: pallas_call(add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                    interpret=True)(x, w)
    x, w = jnp.arange(8.0).reshape(2, 4), jnp.ones((1, 4))
    np.testing.assert_array_equal(call(x, w), x + w)

    def body(x, w):
        out = call(x, vma.varying_like(w, x))
        assert vma.varying_axes(out) == {"x"}
        return out

    fn = jax.shard_map(body, mesh=_mesh(), in_specs=(P("x"), P()), out_specs=P("x"))
    jax.make_jaxpr(fn)(x, w)


def test_triton_params_pass_warps_and_stages():
    params = triton_params(num_warps=8, num_stages=3)
    assert (params.num_warps, params.num_stages) == (8, 3)
    assert triton_params(4).num_stages == 1
