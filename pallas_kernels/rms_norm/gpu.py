"""RMSNorm kernels for NVIDIA GPUs: Pallas with the Triton lowering (testable in interpret mode
on CPU).

Layout `[rows, channels]` (the API flattens the leading axes), channels in groups of `G`. Every
ref is the whole array in global memory; a program reads its tile `[rows, G]` with masked loads
(rows past the last and the group's padding to a power of two read as zeros), so nothing is
padded or copied in XLA. A row's group is contiguous in memory: the loads coalesce.

With a = x (plain, and gated with `norm_before_gate`) or a = x·silu(z) (gated otherwise),
r = 1/√(mean_G(a²) + ε), n = a·r:

- forward, per (tile of rows, group): y = n·γ, times silu(z) with `norm_before_gate`.
- backward, per (run of row tiles, group), looping over its tiles and recomputing n from the
  inputs (nothing else is saved): with c the cotangent of n·γ (dy, or dy·silu(z)),
  dn = c·γ, da = r·(dn − n·mean_G(dn·n)); dx = da (times silu(z) when the gate is inside the
  norm); dz = dy·n·γ·silu'(z) or da·x·silu'(z); the partial sums dγ = Σ_rows c·n of the run,
  kept as a tile over the loop and reduced over its rows once at its end (summed over the runs
  in XLA). Options (`BlockSizes`): `backward_joint_sums` takes both row sums from one
  reduction (Σ dn·n = r·Σ dn·a; on in `default_block_sizes` since session 18);
  `backward_prefetch` loads the next tile before this one's math (off).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.gpu_elementwise import iota, sigmoid
from pallas_kernels.rms_norm.block_sizes import BlockSizes, padded

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Static:
    """The static configuration of one call. `dtype`: y's."""

    group_size: int
    gated: bool
    norm_before_gate: bool
    eps: float
    dtype: Any
    blocks: BlockSizes
    interpret: bool


@dataclasses.dataclass(frozen=True)
class _Tile:
    """Rows `rows` `[BR, 1]` of group `group`: channels `group·G + local`, `local` `[1, W]`
    (W = G padded to a power of two)."""

    rows: jax.Array
    local: jax.Array
    group: jax.Array
    num_rows: int
    size: int

    @property
    def cols(self) -> jax.Array:
        return self.group * self.size + self.local

    @property
    def mask(self) -> jax.Array:
        return (self.rows < self.num_rows) & (self.local < self.size)

    def load(self, ref) -> jax.Array:
        """`ref[rows, cols]` in its dtype, zero past the last row and the group's end."""
        return pltriton.load(ref.at[self.rows, self.cols], mask=self.mask, other=0)

    def read(self, ref) -> jax.Array:
        """`ref[rows, cols]` in float32."""
        return self.load(ref).astype(F32)

    def write(self, ref, value: jax.Array) -> None:
        pltriton.store(ref.at[self.rows, self.cols], value.astype(ref.dtype), mask=self.mask)

    def scale(self, ref) -> jax.Array:
        """γ of the group `[1, W]` in float32 (zero in the padding)."""
        return pltriton.load(ref.at[self.cols], mask=self.local < self.size,
                             other=0).astype(F32)


def _tile(st: Static, num_rows: int, first_row, block_rows: int, group) -> _Tile:
    width = padded(st.group_size)
    return _Tile(first_row + iota((block_rows, 1), 0), iota((1, width), 1), group, num_rows,
                 st.group_size)


def _unpack(refs, st: Static, outputs: int):
    """x, γ, z (or None), the other inputs, the outputs."""
    refs = list(refs)
    x_ref, w_ref = refs.pop(0), refs.pop(0)
    z_ref = refs.pop(0) if st.gated else None
    return x_ref, w_ref, z_ref, refs[:-outputs], refs[-outputs:]


def _gated(x, z, st: Static):
    """(a, gate, silu'(z)) of a tile: a the normalized input (x, or x·silu(z) with the gate
    inside the norm); gate and silu' None without a gate."""
    gate = dgate = None
    a = x
    if st.gated:
        s = sigmoid(z)
        gate, dgate = z * s, s * (1.0 + z * (1.0 - s))
        if not st.norm_before_gate:
            a = x * gate
    return a, gate, dgate


def _rsqrt(sum_sq, st: Static):
    """r = 1/√(mean(a²) + ε) from the row sums Σa² `[BR, 1]`."""
    return lax.rsqrt(sum_sq * (1.0 / st.group_size) + st.eps)


def _normed(x, z, st: Static):
    """(n, r, gate, silu'(z)) of a tile: gate and silu' None without a gate."""
    a, gate, dgate = _gated(x, z, st)
    r = _rsqrt(jnp.sum(a * a, axis=1, keepdims=True), st)
    return a * r, r, gate, dgate


def _inputs(x, scale, z):
    return [a for a in (x, scale, z) if a is not None]



# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(*refs, st: Static):
    x_ref, w_ref, z_ref, _, (y_ref,) = _unpack(refs, st, 1)
    BR = st.blocks.block_rows
    tile = _tile(st, x_ref.shape[0], pl.program_id(0) * BR, BR, pl.program_id(1))
    z = tile.read(z_ref) if st.gated else None
    n, _, gate, _ = _normed(tile.read(x_ref), z, st)
    y = n * tile.scale(w_ref)
    if st.gated and st.norm_before_gate:
        y = y * gate
    tile.write(y_ref, y)


def forward(x, scale, z, st: Static):
    """y `[N, C]` in `st.dtype`."""
    rows, channels = x.shape
    BR = st.blocks.block_rows
    return pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(pl.cdiv(rows, BR), channels // st.group_size),
        out_shape=jax.ShapeDtypeStruct(x.shape, st.dtype),
        compiler_params=triton_params(st.blocks.num_warps),
        interpret=st.interpret, name="rms_norm_forward",
    )(*_inputs(x, scale, z))


# --- backward --------------------------------------------------------------------------------


def backward_steps(rows: int, blocks: BlockSizes) -> int:
    """Loop steps per backward program: the configured ones, fewer for few rows."""
    return min(blocks.backward_steps, pl.cdiv(rows, blocks.backward_block_rows))


def _backward_kernel(*refs, st: Static, steps: int):
    x_ref, w_ref, z_ref, (dy_ref,), outs = _unpack(refs, st, 3 if st.gated else 2)
    dx_ref, dg_ref = outs[:2]
    BR, G, prefetch = st.blocks.backward_block_rows, st.group_size, st.blocks.backward_prefetch
    rows = x_ref.shape[0]
    run, group = pl.program_id(0), pl.program_id(1)  # (not read inside the loop: interpret)
    gamma = _tile(st, rows, 0, BR, group).scale(w_ref)
    # with prefetch, rows past the run are masked, so that the last step's prefetch (the next
    # run's first tile) reads nothing
    end = jnp.minimum(rows, (run + 1) * steps * BR) if prefetch else rows
    tile_at = lambda s: _tile(st, end, (run * steps + s) * BR, BR, group)

    def inputs(tile, stored=False):
        """x, dy, z (None without a gate) of a tile in float32, or in their dtypes."""
        get = tile.load if stored else tile.read
        return get(x_ref), get(dy_ref), get(z_ref) if st.gated else None

    def step(s, carry):
        dgamma, ahead = carry
        tile = tile_at(s)
        if prefetch:  # the next tile's loads fly while this one reduces (bf16 in registers)
            x, dy, z = (None if v is None else v.astype(F32) for v in ahead)
            ahead = inputs(tile_at(s + 1), stored=True)
        else:
            x, dy, z = inputs(tile)
        a, gate, dgate = _gated(x, z, st)
        inner = st.gated and st.norm_before_gate  # y = (n·γ)·gate
        c = dy * gate if inner else dy  # the cotangent of n·γ
        dn = c * gamma
        if st.blocks.backward_joint_sums:
            # Σ dn·n = r·Σ dn·a: both row sums from one reduction of the stacked products, one
            # exchange across warps a step (3 barriers instead of 6), neither waiting on r
            sums = jnp.sum(jnp.stack([a * a, dn * a], axis=-1), axis=1)  # [BR, 2]
            sum_sq, sum_dn_a = (v[:, None] for v in lax.unstack(sums, axis=-1))
            r = _rsqrt(sum_sq, st)
            n, mean_dn_n = a * r, r * sum_dn_a * (1.0 / G)
        else:
            r = _rsqrt(jnp.sum(a * a, axis=1, keepdims=True), st)
            n = a * r
            mean_dn_n = jnp.sum(dn * n, axis=1, keepdims=True) * (1.0 / G)
        da = r * (dn - n * mean_dn_n)
        if st.gated and not st.norm_before_gate:  # a = x·gate
            tile.write(dx_ref, da * gate)
            tile.write(outs[2], da * x * dgate)
        else:
            tile.write(dx_ref, da)
            if inner:
                tile.write(outs[2], dy * n * gamma * dgate)
        return dgamma + c * n, ahead  # tile-shaped: one reduction over rows per program

    first = inputs(tile_at(0), stored=True) if prefetch else None
    dgamma, _ = lax.fori_loop(0, steps, step, (jnp.zeros((BR, padded(G)), F32), first))
    tile = _tile(st, rows, 0, BR, group)
    pltriton.store(dg_ref.at[run, tile.cols[0]], jnp.sum(dgamma, axis=0),
                   mask=tile.local[0] < G)


def backward(x, scale, z, dy, st: Static):
    """dx `[N, C]` (x's dtype), float32 partial sums dγ `[R, C]` over the backward programs' runs
    of rows, and (gated) dz `[N, C]` (z's dtype)."""
    rows, channels = x.shape
    blocks = st.blocks
    steps = backward_steps(rows, blocks)
    runs = pl.cdiv(rows, steps * blocks.backward_block_rows)
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype),
                 jax.ShapeDtypeStruct((runs, channels), F32)]
    if st.gated:
        out_shape.append(jax.ShapeDtypeStruct(z.shape, z.dtype))
    return pallas_call(
        functools.partial(_backward_kernel, st=st, steps=steps),
        grid=(runs, channels // st.group_size),
        out_shape=out_shape,
        compiler_params=triton_params(blocks.backward_num_warps, blocks.backward_num_stages),
        interpret=st.interpret, name="rms_norm_backward",
    )(*_inputs(x, scale, z), dy)
