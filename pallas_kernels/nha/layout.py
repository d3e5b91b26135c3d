"""Static configuration of one NHA call and the array layout of each backend's kernels.

GPU kernels take `[batch, time, heads, dim]` (the op's layout); TPU kernels take
`[batch, heads, time, dim]`, so that a block's last two axes are (time rows, features), as
Mosaic's (8, 128) tiling wants. `Layout` builds the block specs of both from one description,
so the per-chunk slot kernels (`slot_kernels.py`) are written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.nha.block_sizes import BlockSizes
from pallas_kernels.nha.chunk_math import F32, Rows, iota


@dataclasses.dataclass(frozen=True)
class Static:
    """The static part of one NHA call (hashable: it is a `custom_vjp` nondiff argument).

    window: w clipped to the length; slots: the slot branch takes part (False only when the
    slots can never hold a token and empty slots are masked); mask_empty: rows t < w leave the
    (empty) slots out of the softmax; group: query heads per kv head; shift_chunks: D > 0 when
    the slot inputs are passed undelayed and w = D·C: stream chunk c then reads (and its
    gradients go to) token chunk (c − D) mod NC, the chunks c < D counting as empty (0: the
    inputs come delayed already).
    """

    window: int
    scale: float
    slots: bool
    mask_empty: bool
    group: int
    blocks: BlockSizes
    interpret: bool
    shift_chunks: int = 0


def slot_dtype(st: Static, input_dtype, gradient: bool = False):
    """Operand dtype of a slot product (`BlockSizes.slot_precision`): "float32" always float32,
    "input" always the 16-bit type, "mixed" the 16-bit type only for the `gradient` products
    of the backward (dq, dk̄, dv̄), float32 for the forward and for what feeds the backward's
    cancellations (dP, D = o·dO, ds̄ and the log-gate gradient). The 16-bit type is bfloat16
    even for float16 inputs: the fast path's factors reach e^{±60}, beyond float16's range."""
    precision = st.blocks.slot_precision
    if precision == "float32" or (precision == "mixed" and not gradient):
        return F32
    return jnp.bfloat16 if input_dtype == jnp.float16 else input_dtype


def visible(rows: jax.Array, st: Static) -> jax.Array:
    """Rows whose softmax includes the slots (with masked empty slots: t ≥ w)."""
    return rows >= st.window if st.mask_empty else rows >= 0


def stream_chunk(st: Static, c, num_chunks: int):
    """Token chunk read by stream chunk c (the slot inputs enter w = D·C steps late)."""
    return lax.rem(c + num_chunks - st.shift_chunks, num_chunks)


def chunk_valid(st: Static, axis: int) -> jax.Array:
    """This program's stream chunk holds tokens (it is not one of the D empty leading chunks)."""
    return pl.program_id(axis) >= st.shift_chunks


def masked(rows: Rows, valid: jax.Array) -> Rows:
    return lambda start, size: jnp.where(valid, rows(start, size), 0)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where time and heads sit, and the backend's kernel parameters.

    head_major: arrays are `[B, H, T, d]` (TPU) rather than `[B, T, H, d]` (GPU).
    params: `(st, num_warps, num_grid_axes, sequential_last)` → compiler params.
    interpret: `st` → the `interpret=` argument of `pallas_call`.
    cumsum / reverse_cumsum: in-kernel inclusive (reverse) cumulative sums over rows of a
      float32 `[C, M]` tile.
    """

    head_major: bool
    params: Callable[..., Any]
    interpret: Callable[[Static], Any]
    cumsum: Callable[[jax.Array], jax.Array]
    reverse_cumsum: Callable[[jax.Array], jax.Array]

    def seq(self, rows: int, dim: int, index: Callable) -> pl.BlockSpec:
        """Block of `rows` time steps of one head of a `[B, ·, ·, dim]` array; index maps the
        grid to (batch, head, time block)."""
        if self.head_major:
            return pl.BlockSpec((None, None, rows, dim),
                                lambda *grid: _place(index(*grid), (0, 1, 2)))
        return pl.BlockSpec((None, rows, None, dim), lambda *grid: _place(index(*grid), (0, 2, 1)))

    def grouped(self, x: jax.Array, group: int) -> jax.Array:
        """Query-head array viewed per kv head: `[B, T, G, group, d]` or `[B, G, group, T, d]`."""
        if self.head_major:
            b, h, t, d = x.shape
            return x.reshape(b, h // group, group, t, d)
        b, t, h, d = x.shape
        return x.reshape(b, t, h // group, group, d)

    def grouped_seq(self, rows: int, group: int, dim: int, index: Callable) -> pl.BlockSpec:
        """Block of `rows` steps of every query head of one kv head (arrays from `grouped`)."""
        if self.head_major:
            return pl.BlockSpec((None, None, group, rows, dim),
                                lambda *grid: _place(index(*grid), (0, 1, 3), 5))
        return pl.BlockSpec((None, rows, None, group, dim),
                            lambda *grid: _place(index(*grid), (0, 2, 1), 5))

    def head_rows(self, ref, r: int) -> Rows:
        """Rows of query head r of a `grouped_seq` block."""
        if self.head_major:
            return lambda start, size: ref[r, pl.ds(start, size), :]
        return lambda start, size: ref[pl.ds(start, size), r, :]

    def rows_spec(self, rows: int, index: Callable) -> pl.BlockSpec:
        """Block of a per-row `[B, H, T]` array (log-sum-exp, D): same in both layouts."""
        return pl.BlockSpec((None, None, rows), lambda *grid: index(*grid))


def _place(bht, positions, rank: int = 4):
    """(batch, head, time) indices placed at `positions` of a block index of `rank` axes."""
    out = [0] * rank
    for value, position in zip(bht, positions, strict=True):
        out[position] = value
    return tuple(out)


def triangular_cumsum(x: jax.Array) -> jax.Array:
    """Inclusive cumulative sum over rows as a float32 matmul with a lower-triangular matrix
    (for Mosaic TPU, which has no cumsum)."""
    n = x.shape[0]
    lower = (iota((n, n), 0) >= iota((n, n), 1)).astype(F32)
    return lax.dot_general(lower, x, (((1,), (0,)), ((), ())), precision=lax.Precision.HIGHEST,
                           preferred_element_type=F32)


def triangular_reverse_cumsum(x: jax.Array) -> jax.Array:
    n = x.shape[0]
    upper = (iota((n, n), 0) <= iota((n, n), 1)).astype(F32)
    return lax.dot_general(upper, x, (((1,), (0,)), ((), ())), precision=lax.Precision.HIGHEST,
                           preferred_element_type=F32)
