"""Short-convolution Pallas kernels (interpret mode, float32) against a float64 numpy per-token
reference and against the op's XLA rung: values and gradients of x, w and b, with documents
on and off tile edges and of length 1, odd lengths, T < K, K = 1..4 (and 8, slow), with and
without a bias and SiLU; bf16 within its rounding; the Triton lowering at the GPU's shapes;
the errors; the op's dispatch.

Tiny tiles (8 steps × 4 channels forward; the backward 2 channels, 4 steps a loop iteration and
3 iterations a program) so that a short row spans several tiles and programs of each kernel;
the backward also at 2 steps an iteration (fewer than K − 1 = 3 at K = 4: the steps after a
run partly read anew).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from hybrid_jax.ops import dispatch
from hybrid_jax.ops.short_conv import _RUNGS
from pallas_kernels.short_conv import api
from pallas_kernels.short_conv.block_sizes import BlockSizes, default_block_sizes
from tests.helpers import assert_close, normals

TINY = BlockSizes(block_t=8, block_c=4, backward_block_t=4, backward_block_c=2,
                  backward_steps=3)
# 12 and 6 steps a backward program.
BLOCKS = [pytest.param(TINY, id="u4"),
          pytest.param(dataclasses.replace(TINY, backward_block_t=2), id="u2")]
C = 5  # channels: one partial tile of each kernel


def segments_from_lengths(*rows):
    """`[B, T]` ids from per-row document lengths (ids 0, 1, ...)."""
    return np.asarray([np.repeat(np.arange(len(r)), r) for r in rows], np.int32)


# T = 37 (odd). Row 0: starts at 8 and 16 (forward tile edges; backward tiles of 4, programs of
# 12), a 1-token document, a 3-token one (< K); row 1: starts off every edge, long documents.
PACKED = segments_from_lengths([8, 8, 1, 3, 17], [5, 1, 25, 6])


def reference(x, w, b, ids, activation, dy):
    """y and (dx, dw, db) of Σ dy·y token by token in float64: z_t = b + Σ_i w_i x_{t−i} over
    the taps in t's document, y = act(z); dz = dy·act'(z), dx_s = Σ_i w_i dz_{s+i} [same
    document], dw_i = Σ_t dz_t x_{t−i} [same document], db = Σ_t dz_t."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    batch, length, channels = x.shape
    size = w.shape[0]
    b = np.zeros(channels) if b is None else np.asarray(b, np.float64)
    ids = np.zeros((batch, length), int) if ids is None else np.asarray(ids)
    taps = lambda r, t: [i for i in range(size) if t - i >= 0 and ids[r, t - i] == ids[r, t]]
    z = np.zeros_like(x)
    for r in range(batch):
        for t in range(length):
            z[r, t] = b + sum((w[i] * x[r, t - i] for i in taps(r, t)), np.zeros(channels))
    sig = 1 / (1 + np.exp(-z))
    y = z * sig if activation else z
    dz = dy * (sig * (1 + z * (1 - sig)) if activation else 1.0)
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for r in range(batch):
        for t in range(length):
            for i in taps(r, t):
                dx[r, t - i] += w[i] * dz[r, t]
                dw[i] += dz[r, t] * x[r, t - i]
    return y, (dx, dw, dz.sum((0, 1)))


def inputs(seed, batch, length, size, dtype=np.float32):
    x, w, b, dy = normals(seed, (batch, length, C), (size, C), (C,), (batch, length, C),
                          dtype=np.float32)
    return x.astype(dtype), w, b, dy.astype(dtype)


def kernel_vjp(x, w, b, ids, activation, dy, blocks=TINY):
    ids = None if ids is None else jnp.asarray(ids)
    fn = lambda x, w, b: api.short_conv(x, w, b, segment_ids=ids, activation=activation,
                                        block_sizes=blocks, interpret=True)
    y, vjp = jax.vjp(fn, x, w, b)
    return y, vjp(dy)


def xla_vjp(x, w, b, ids, activation, dy):
    ids = None if ids is None else jnp.asarray(ids)
    fn = lambda x, w, b: ops.short_conv(x, w, b, segment_ids=ids, activation=activation,
                                        implementation="xla")
    y, vjp = jax.vjp(fn, x, w, b)
    return y, vjp(dy)


def check(x, w, b, ids, activation, dy, tol=1e-5, blocks=TINY):
    what = f"K={w.shape[0]} T={x.shape[1]} bias={b is not None} silu={activation} " \
           f"documents={ids is not None} steps an iteration={blocks.backward_block_t}"
    y, grads = kernel_vjp(x, w, b, ids, activation, dy, blocks)
    y_ref, grads_ref = reference(x, w, b, ids, activation, dy)
    grads_ref = grads_ref if b is not None else grads_ref[:2] + (None,)
    assert_close(y, y_ref, tol, what + " values vs float64")
    assert_close(grads, grads_ref, tol, what + " gradients vs float64")
    y_xla, grads_xla = xla_vjp(x, w, b, ids, activation, dy)
    assert_close(y, y_xla, tol, what + " values vs the xla rung")
    assert_close(grads, grads_xla, tol, what + " gradients vs the xla rung")


@pytest.mark.parametrize("size, bias, activation, documents", [
    (4, True, True, True),
    (4, False, False, True),
    (3, True, False, False),
    (2, False, True, True),
    (1, True, True, True),
    pytest.param(8, True, True, True, marks=pytest.mark.slow),
])
@pytest.mark.parametrize("blocks", BLOCKS)
def test_matches_reference(size, bias, activation, documents, blocks):
    x, w, b, dy = inputs(size, 2, PACKED.shape[1], size)
    check(x, w, b if bias else None, PACKED if documents else None, activation, dy,
          blocks=blocks)


@pytest.mark.parametrize("length", [3, pytest.param(1, marks=pytest.mark.slow)])
@pytest.mark.parametrize("blocks", BLOCKS)
def test_rows_shorter_than_the_taps(length, blocks):
    """T < K: every tap past the row's start reads zeros (row 0 starts with a 1-token
    document)."""
    x, w, b, dy = inputs(10 + length, 2, length, 4)
    ids = np.asarray([[0, 1, 1][:length], [2, 2, 2][:length]], np.int32)
    check(x, w, b, ids, True, dy, blocks=blocks)


def test_backward_without_contiguous_documents():
    """The backward's unmasked steps (one id over K − 1 + 4 steps) and masked ones
    where an id comes back after another (the document test is id equality, as the
    reference's)."""
    x, w, b, dy = inputs(40, 2, PACKED.shape[1], 4)
    ids = PACKED.copy()
    ids[1, 10:12] = 0  # row 1: ids 0 1 2 2 2 2 0 0 2 …: steps 9 .. 15 start, end in 2
    check(x, w, b, ids, True, dy)


def test_documents_isolate():
    """A document's outputs do not depend on any other document's inputs, and the kernel's
    outputs with documents differ from those without."""
    x, w, b, dy = inputs(20, 2, PACKED.shape[1], 4)
    run = lambda x, ids: api.short_conv(x, w, b, segment_ids=ids, activation=True,
                                        block_sizes=TINY, interpret=True)
    ids = jnp.asarray(PACKED)
    y = run(x, ids)
    other = jnp.where((ids == 2)[..., None], x, 10.0 * x)  # row 0's 1-token document kept
    np.testing.assert_array_equal(np.asarray(run(other, ids))[0, 16], np.asarray(y)[0, 16])
    assert not np.allclose(run(x, None), y)


@pytest.mark.parametrize("blocks", BLOCKS[:1])
def test_bfloat16_within_rounding(blocks):
    """bf16 x and dy: y, dx (bf16) and dw, db (float32 sums) within bf16's rounding of the
    float64 reference on the same values."""
    x, w, b, dy = inputs(30, 2, PACKED.shape[1], 4, jnp.bfloat16)
    y, grads = kernel_vjp(x, w, b, PACKED, True, dy, blocks)
    assert y.dtype == grads[0].dtype == jnp.bfloat16 and grads[1].dtype == jnp.float32
    y_ref, grads_ref = reference(x, w, b, PACKED, True, dy)
    assert_close(y, y_ref, 1e-2, "bf16 values")
    assert_close(grads, grads_ref, 1e-2, "bf16 gradients")


@pytest.mark.parametrize("channels, documents", [(1536, True), (768, False)])
def test_kernels_lower_to_triton_at_gpu_shapes(monkeypatch, channels, documents):
    """Forward and backward build their Triton kernels (Pallas' Triton lowering, no GPU
    needed) at gdn-340m's shapes and the default tiles: bf16 [4, 8192, C], K = 4, SiLU."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
    ids = spec(4, 8192, dtype=jnp.int32) if documents else None

    def grads(x, w, b, ids):
        y, vjp = jax.vjp(lambda x, w, b: api.short_conv(x, w, b, segment_ids=ids,
                                                        activation=True),
                         x, w, b)
        return vjp(y)

    text = jax.jit(grads).trace(spec(4, 8192, channels), spec(4, channels, dtype=jnp.float32),
                                spec(channels, dtype=jnp.float32), ids).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 2


@pytest.mark.parametrize("args, message", [
    (((2, 8, 5), (4, 5, 1)), r"expected x \[B, T, C\] and weight \[K, C\], got shapes"),
    (((2, 8), (4, 5)), r"expected x \[B, T, C\] and weight \[K, C\], got shapes"),
    (((2, 8, 5), (4, 6)), r"weight must be \[K, 5\] \(x's channels\), got \(4, 6\)"),
    (((2, 8, 5), (9, 5)), r"size K \(weight.shape\[0\]\) must be in 1..8, got 9"),
    (((2, 8, 5), (4, 5), (6,)), r"bias must be \[5\] \(x's channels\) or None, got \(6,\)"),
])
def test_bad_inputs_are_named(args, message):
    arrays = [jnp.zeros(shape) for shape in args]
    with pytest.raises(ValueError, match=message):
        api.short_conv(*arrays, interpret=True)


def test_bad_segment_ids_and_platform_are_named():
    x, w = jnp.zeros((2, 8, 5)), jnp.zeros((4, 5))
    with pytest.raises(ValueError, match=r"segment_ids must be integer \[2, 8\], got float32"):
        api.short_conv(x, w, segment_ids=jnp.zeros((2, 8)), interpret=True)
    with pytest.raises(ValueError, match="run on GPUs .* target platform is cpu"):
        api.short_conv(x, w)


def test_op_checks_its_inputs():
    x, w = jnp.zeros((2, 8, 5)), jnp.zeros((4, 5))
    with pytest.raises(ValueError, match=r"short_conv: axis C of weight .* is 6, but x"):
        ops.short_conv(x, jnp.zeros((4, 6)))
    with pytest.raises(ValueError, match=r"short_conv: x must have shape \[B,T,C\]"):
        ops.short_conv(jnp.zeros((2, 8)), w)
    with pytest.raises(ValueError, match=r"axis T of segment_ids .* is 9, but x"):
        ops.short_conv(x, w, segment_ids=jnp.zeros((2, 9), jnp.int32))
    with pytest.raises(ValueError, match="implementation='pallas' cannot run this call: the "
                                         "kernels run on GPUs"):
        ops.short_conv(x, w, implementation="pallas")


def test_dispatch_takes_the_kernels_on_a_gpu_and_logs_a_fallback(monkeypatch, caplog):
    """On a GPU auto takes the kernels for the benchmark's packed bf16 shapes; where they cannot
    run the call (K > 8) it falls to the XLA rung and logs why, and a named
    `implementation="pallas"` refuses naming the reason; on the CPU auto is the XLA rung
    without a word."""
    spec = jax.ShapeDtypeStruct
    x, ids = spec((4, 8192, 1536), jnp.bfloat16), spec((4, 8192), jnp.int32)
    kwargs = dict(segment_ids=ids, activation=True, head_channels=True)
    w, w9 = spec((4, 1536), jnp.float32), spec((9, 1536), jnp.float32)
    assert dispatch.choose("short_conv", _RUNGS, None, x, w, None, **kwargs) == (_RUNGS[1], [])
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert dispatch.choose("short_conv", _RUNGS, None, x, w, None, **kwargs) == (_RUNGS[0], [])
    rung, reasons = dispatch.choose("short_conv", _RUNGS, None, x, w9, None, **kwargs)
    assert rung.name == "xla" and "must be in 1..8, got 9" in reasons[0]
    dispatch._LOGGED.clear()
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.dispatch"):
        jax.eval_shape(lambda x, w, ids: ops.short_conv(x, w, segment_ids=ids), x, w9, ids)
    assert "ran the xla rung" in caplog.text and "must be in 1..8, got 9" in caplog.text
    with pytest.raises(ValueError, match="must be in 1..8, got 9"):
        dispatch.choose("short_conv", _RUNGS, "pallas", x, w9, None, **kwargs)


def test_default_tiles_are_valid():
    assert default_block_sizes() == BlockSizes()
    with pytest.raises(ValueError, match="block_c must be a power of two, got 96"):
        BlockSizes(block_c=96)


def test_empty_inputs_are_refused():
    """T = 0: a reason, not a crash in the kernels (the XLA rung takes it)."""
    assert "must not be empty" in api.unsupported(jnp.zeros((1, 0, 5)), jnp.zeros((4, 5)),
                                                  interpret=True)
