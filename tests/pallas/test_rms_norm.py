"""RMSNorm Pallas kernels (interpret mode, float32) against a float64 numpy per-row reference
(gradients by central differences) and against the op's XLA rung: values and gradients of x, z
and γ, plain and both gated forms, one group and several (of widths that are and are not powers
of two), row counts that are no multiple of the tiles; the backward's options (joint sums,
prefetch) likewise; bf16 within its rounding; the Triton lowering at the GPU's shapes; the
errors.

Tiny tiles (8 rows forward; 4 rows, 3 steps a program, backward) so that 37 rows span several
programs of each kernel, the last one partly past the end.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from pallas_kernels.rms_norm import api
from pallas_kernels.rms_norm.block_sizes import BlockSizes, default_block_sizes
from tests.helpers import assert_close, normals

TINY = BlockSizes(block_rows=8, backward_block_rows=4, backward_steps=3)
ROWS, C, EPS = 37, 12, 1e-6
GATES = [pytest.param(None, id="plain"), pytest.param(True, id="norm_before_gate"),
         pytest.param(False, id="gate_inside")]


def reference_y(x, z, g, group_size, norm_before_gate, eps=EPS):
    """y row by row and group by group in float64."""
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    z = None if z is None else np.asarray(z, np.float64)
    y = np.zeros_like(x)
    for r in range(x.shape[0]):
        for start in range(0, x.shape[1], group_size):
            cols = slice(start, start + group_size)
            a = x[r, cols]
            gate = None if z is None else z[r, cols] / (1 + np.exp(-z[r, cols]))
            if gate is not None and not norm_before_gate:
                a = a * gate
            out = a / np.sqrt(np.mean(a * a) + eps) * g[cols]
            y[r, cols] = out * gate if gate is not None and norm_before_gate else out
    return y


def reference(x, z, g, group_size, norm_before_gate, dy, h=1e-6):
    """y and the gradients (dx, dz, dγ) of Σ dy·y, by central differences in float64 (one
    column of every row at a time: the rows are independent)."""
    x, g, dy = (np.asarray(a, np.float64) for a in (x, g, dy))
    z = None if z is None else np.asarray(z, np.float64)
    loss = lambda x, z, g: np.sum(dy * reference_y(x, z, g, group_size, norm_before_gate))

    def grad(args, i):
        out = np.zeros_like(args[i])
        for c in range(args[i].shape[-1]):
            up, down = ([None if a is None else a.copy() for a in args] for _ in range(2))
            up[i][..., c] += h
            down[i][..., c] -= h
            if out.ndim == 1:
                out[c] = (loss(*up) - loss(*down)) / (2 * h)
            else:  # per row: the rows are independent
                rows_up = dy * reference_y(*up, group_size, norm_before_gate)
                rows_down = dy * reference_y(*down, group_size, norm_before_gate)
                out[:, c] = (rows_up - rows_down).sum(1) / (2 * h)
        return out

    args = (x, z, g)
    dz = None if z is None else grad(args, 1)
    return reference_y(x, z, g, group_size, norm_before_gate), (grad(args, 0), dz, grad(args, 2))


def inputs(seed, rows=ROWS, channels=C, gated=True, dtype=np.float32):
    x, z, g, dy = normals(seed, (rows, channels), (rows, channels), (channels,),
                          (rows, channels), dtype=np.float32)
    g = g + 1.0  # γ around 1, as trained
    return x.astype(dtype), z.astype(dtype) if gated else None, g, dy.astype(dtype)


def kernel_vjp(x, z, g, group_size, norm_before_gate, dy, blocks=TINY, **kwargs):
    fn = lambda x, z, g: api.rms_norm(x, g, z, group_size=group_size,
                                      norm_before_gate=norm_before_gate, block_sizes=blocks,
                                      interpret=True, **kwargs)
    y, vjp = jax.vjp(fn, x, z, g)
    return y, vjp(dy)


def xla_vjp(x, z, g, group_size, norm_before_gate, dy):
    if z is None:
        fn = lambda x, z, g: ops.rms_norm(x, g, eps=EPS, implementation="xla")
    else:
        fn = lambda x, z, g: ops.gated_rms_norm(x, z, g, group_size=group_size,
                                                norm_before_gate=norm_before_gate, eps=EPS,
                                                implementation="xla")
    y, vjp = jax.vjp(fn, x, z, g)
    return y, vjp(dy)


@pytest.mark.parametrize("group_size", [C, 4, 3])
@pytest.mark.parametrize("gate", GATES)
def test_matches_reference(gate, group_size):
    """37 rows (tiles of 8 and 4: partial last tiles and runs); groups of 12 (one, padded to
    16), 4 and 3 (padded to 4), the plain norm also in groups."""
    x, z, g, dy = inputs(group_size, gated=gate is not None)
    assert_matches_references(x, z, g, dy, group_size, gate, TINY,
                              f"gate={gate} group={group_size}")


def assert_matches_references(x, z, g, dy, group_size, gate, blocks, what):
    """The kernels' y and gradients equal the float64 reference's and the XLA rung's."""
    y, grads = kernel_vjp(x, z, g, group_size, bool(gate), dy, blocks=blocks)
    y_ref, grads_ref = reference(x, z, g, group_size, bool(gate), dy)
    assert_close(y, y_ref, 1e-5, what + " values vs float64")
    assert_close(grads, grads_ref, 1e-5, what + " gradients vs float64")
    if gate is None and group_size != C:
        return  # (the op's plain norm is over the whole last axis)
    y_xla, grads_xla = xla_vjp(x, z, g, group_size, bool(gate), dy)
    assert_close(y, y_xla, 1e-5, what + " values vs the xla rung")
    assert_close(grads, grads_xla, 1e-5, what + " gradients vs the xla rung")


# The backward's options (NOTES.md "Session 18"; `default_block_sizes` turns the joint sums on,
# TINY keeps the separate sums).
OPTIONS = [pytest.param(dict(backward_joint_sums=True), id="joint_sums"),
           pytest.param(dict(backward_prefetch=True), id="prefetch"),
           pytest.param(dict(backward_joint_sums=True, backward_prefetch=True), id="both")]


@pytest.mark.parametrize("rows", [ROWS, 24])
@pytest.mark.parametrize("group_size", [C, 3])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("gate", GATES)
def test_backward_options_match_reference(gate, options, group_size, rows):
    """Each backward option, float32: values and the gradients of x, z, γ against the float64
    reference and the XLA rung. Runs of 3 steps of 4 rows: 37 rows end in a run of one row
    (its tiles past the end masked, and each run's prefetch past its last step), 24 rows in
    two whole runs; groups of 12 (one, padded to 16) and 3 (padded to 4: masked channels in
    the stacked sums)."""
    x, z, g, dy = inputs(rows + group_size, rows=rows, gated=gate is not None)
    assert_matches_references(x, z, g, dy, group_size, gate, dataclasses.replace(TINY, **options),
                              f"{options} gate={gate} group={group_size} rows={rows}")


@pytest.mark.parametrize("gate", GATES)
def test_default_tiles_and_leading_axes(gate):
    """`[B, T, H, C]` inputs (Gated DeltaNet's per-head norm) with the default tiles: one
    program of each kernel; the shape comes back."""
    x, z, g, dy = inputs(5, rows=2 * 5 * 3, channels=8, gated=gate is not None)
    y, grads = kernel_vjp(x, z, g, 8, bool(gate), dy, blocks=None)
    shape = (2, 5, 3, 8)
    four = lambda a: None if a is None else a.reshape(shape)
    y4, grads4 = kernel_vjp(four(x), four(z), g, None, bool(gate), four(dy), blocks=None)
    assert y4.shape == shape and grads4[0].shape == shape
    assert_close(y4.reshape(y.shape), y, 1e-6, "leading axes")
    assert_close(jax.tree.map(lambda a: a.reshape(-1, 8) if a.ndim == 4 else a, grads4),
                 grads, 1e-6, "leading axes, gradients")
    y_ref, grads_ref = reference(x, z, g, 8, bool(gate), dy)
    assert_close(y, y_ref, 1e-5, "default tiles")
    assert_close(grads, grads_ref, 1e-5, "default tiles, gradients")


@pytest.mark.parametrize("gate", GATES)
def test_bfloat16_within_rounding(gate):
    """bf16 x, z and dy: y, dx, dz (bf16) and dγ (float32, γ's dtype) within bf16's rounding of
    the float64 reference on the same values; `dtype=` sets y's dtype."""
    group = 4 if gate is not None else C
    x, z, g, dy = inputs(30, gated=gate is not None, dtype=jnp.bfloat16)
    y, grads = kernel_vjp(x, z, g, group, bool(gate), dy)
    assert y.dtype == grads[0].dtype == jnp.bfloat16 and grads[2].dtype == jnp.float32
    assert gate is None or grads[1].dtype == jnp.bfloat16
    y_ref, grads_ref = reference(x, z, g, group, bool(gate), dy)
    assert_close(y, y_ref, 1e-2, "bf16 values")
    assert_close(grads, grads_ref, 1e-2, "bf16 gradients")
    y32, _ = kernel_vjp(x, z, g, group, bool(gate), dy.astype(jnp.float32), dtype=jnp.float32)
    assert y32.dtype == jnp.float32
    assert_close(y32, y_ref, 1e-5, "bf16 inputs, float32 output")


@pytest.mark.parametrize("channels, group, gate, heads", [
    (1024, 1024, None, False),  # transformer-350m's norms
    (512, 512, True, True),  # gdn-340m's output norm: [B, T, 3, 512]
    (1536, 512, True, False),  # the same as [B, T, 1536] in groups of 512
    (2048, 2048, False, False),  # a Mamba-2-style norm with the gate inside
])
def test_kernels_lower_to_triton_at_gpu_shapes(monkeypatch, channels, group, gate, heads):
    """Forward and backward build their Triton kernels (Pallas' Triton lowering, no GPU
    needed) at the models' shapes and the default tiles: bf16 [4, 8192, (3,) C]."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    shape = (4, 8192, 3, channels) if heads else (4, 8192, channels)
    assert lowered_kernels(shape, group, gate, None) == 2


@pytest.mark.parametrize("channels, group, gate", [(2048, 2048, False), (1536, 512, True)])
def test_backward_options_lower_to_triton(monkeypatch, channels, group, gate):
    """Both backward options (stack/unstack of the joint sums, the prefetch in the loop's
    carry) lower to Triton at Mamba-2's and GDN's shapes, on the default tiles."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    blocks = dataclasses.replace(default_block_sizes(group, gated=True), backward_prefetch=True)
    assert lowered_kernels((4, 8192, channels), group, gate, blocks) == 2


def lowered_kernels(shape, group, gate, blocks) -> int:
    """How many Triton kernels the vjp of bf16 `shape` lowers to for CUDA."""
    spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)

    def grads(x, z, g):
        fn = lambda x, z, g: api.rms_norm(x, g, z, group_size=group,
                                          norm_before_gate=bool(gate), block_sizes=blocks)
        y, vjp = jax.vjp(fn, x, z, g)
        return vjp(y)

    z = spec(*shape) if gate is not None else None
    text = jax.jit(grads).trace(spec(*shape), z, spec(shape[-1], dtype=jnp.float32)).lower(
        lowering_platforms=("cuda",)).as_text()
    return text.count("__gpu$xla.gpu.triton")


@pytest.mark.parametrize("shapes, kwargs, message", [
    (((8, 6), (6,)), dict(group_size=4), r"group_size must divide the channels 6, got 4"),
    (((8, 6), (5,)), {}, r"scale must be \[6\] \(x's channels\), got \(5,\)"),
    (((8, 6), (6, 1)), {}, r"expected x \[..., C\] and scale \[C\], got shapes \(8, 6\) and "
                           r"\(6, 1\)"),
    (((8, 6), (6,), (8, 5)), {}, r"z must have x's shape \(8, 6\), got \(8, 5\)"),
])
def test_bad_inputs_are_named(shapes, kwargs, message):
    arrays = [jnp.zeros(shape) for shape in shapes]
    with pytest.raises(ValueError, match=message):
        api.rms_norm(*arrays, interpret=True, **kwargs)


def test_bad_dtypes_and_platform_are_named():
    x, g = jnp.zeros((8, 6)), jnp.zeros(6)
    with pytest.raises(ValueError, match="x must be floating, got int32"):
        api.rms_norm(x.astype(jnp.int32), g, interpret=True)
    with pytest.raises(ValueError, match="z must be floating, got int32"):
        api.rms_norm(x, g, jnp.zeros((8, 6), jnp.int32), interpret=True)
    with pytest.raises(ValueError, match="dtype must be floating, got int8"):
        api.rms_norm(x, g, dtype=jnp.int8, interpret=True)
    with pytest.raises(ValueError, match="run on GPUs .* target platform is cpu"):
        api.rms_norm(x, g)


def test_default_tiles_are_valid():
    # session 18's backward: 2048-element tiles, 32 steps, 8 warps, joint sums, either form
    backward = dict(backward_steps=32, backward_num_warps=8, backward_joint_sums=True)
    assert default_block_sizes(512) == BlockSizes(block_rows=16, backward_block_rows=4,
                                                  **backward)
    assert default_block_sizes(1024) == BlockSizes(backward_block_rows=2, **backward)
    assert default_block_sizes(1536) == BlockSizes(block_rows=4, backward_block_rows=1,
                                                   **backward)
    assert default_block_sizes(16384).block_rows == 1
    assert all(default_block_sizes(g, gated=True) == default_block_sizes(g)
               for g in (512, 1024, 2048))
    with pytest.raises(ValueError, match="block_rows must be a power of two, got 12"):
        BlockSizes(block_rows=12)


def test_empty_inputs_are_refused():
    """No rows: a reason, not a crash in the kernels (the XLA rung takes it)."""
    assert "must not be empty" in api.unsupported(jnp.zeros((0, 4)), jnp.ones(4),
                                                  interpret=True)
