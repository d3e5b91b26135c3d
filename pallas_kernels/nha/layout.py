"""Static configuration of one NHA call and the array layout of each backend's kernels.

GPU kernels take `[batch, time, heads, dim]` (the op's layout); TPU kernels take
`[batch, heads, time, dim]`, so that a block's last two axes are (time rows, features), as
Mosaic's (8, 128) tiling wants. `Layout` builds the block specs of both from one description,
so the per-chunk slot kernels (`slot_kernels.py`) are written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.base2 import LOG2E
from pallas_kernels.nha.block_sizes import BlockSizes
from pallas_kernels.nha.chunk_math import F32, Products, Rows, iota


@dataclasses.dataclass(frozen=True)
class Static:
    """The static part of one NHA call (hashable: it is a `custom_vjp` nondiff argument).

    window: w (clipped to the length without an initial state); slots: the slot branch takes
    part (False only when the slots can never hold a token and empty slots are masked);
    mask_empty: rows whose slots hold nothing of their document leave the slots out of the
    softmax (else M zero-value sinks); group: query heads per kv head; shift_chunks: D > 0 when
    the slot inputs are passed undelayed and w = D·C: stream chunk c then reads (and its
    gradients go to) token chunk (c − D) mod NC, the chunks c < D counting as empty (0: the
    inputs come delayed already); length: the call's T (stream steps ≥ T take no part, so the
    final slot state is the one after step T − 1); offset: P, the window's key arrays hold P
    positions before the call's first token (the ring of an initial state, front-padded to a
    multiple of the tiles; 0 without one); documents: per-token document arrays are passed
    (`Documents` in api.py: window masks, slot resets, which rows' slots count);
    document_bounds: the GPU window kernels also get each position's span of visible keys
    (queries) within its document and window (`SlotDocs`), visit only the key (query) blocks
    it reaches and skip the mask of those that every row sees in full (without documents the
    spans follow from the window alone; with documents but no spans every block is masked).
    """

    window: int
    scale: float
    slots: bool
    mask_empty: bool
    group: int
    blocks: BlockSizes
    interpret: bool
    shift_chunks: int = 0
    length: int | None = None
    offset: int = 0
    documents: bool = False
    document_bounds: bool = False

    @property
    def scale2(self) -> float:
        """The logit scale in base 2 (the GPU window kernels): exp(scale·s) = exp2(scale2·s)."""
        return LOG2E * self.scale


class SlotProducts(NamedTuple):
    """Operand handling of the three kinds of slot products (`BlockSizes.slot_precision`):
    `state` (a float32 slot state, or its gradient, with a chunk's rows), `intra` (the
    within-chunk pairs and the log-gate gradient's products) and `gradient` (dq, dk̄, dv̄)."""

    state: Products
    intra: Products
    gradient: Products


# Per precision: how the float32 operands of (state, intra, gradient) products are taken.
_WIDE = {
    "float32": ("float32", "float32", "float32"),
    "mixed": ("float32", "float32", "narrow"),
    "split": ("split", "split", "narrow"),
    "input": ("float32", "narrow", "narrow"),
}


def slot_products(st: Static, input_dtype) -> SlotProducts:
    """The slot products' operand handling for inputs (q, k, v) of `input_dtype`.

    A float32 operand is taken as float32 (TF32 on the GPU's tensor cores, exact in interpret
    mode), "narrow" (rounded to the 16-bit type) or "split" (a hi + lo pair of 16-bit values:
    each product becomes two or three 16-bit products, about 16 mantissa bits against TF32's
    11). "mixed" narrows only the gradient products (their rounding stays a rounding of the
    result); what feeds the backward's cancellations (dA = P·(dP − D), the log-gate gradient)
    stays float32 or split: narrowed, it costs an order of magnitude in the gradients'
    accuracy (NOTES.md). Products of two inputs take them as they are (exact).
    The 16-bit type is bfloat16 also for float16 inputs (the fast path's factors reach
    e^{±60}, beyond float16's range); 32-bit inputs (interpret-mode tests) keep every product
    32-bit.
    """
    input_dtype = jnp.dtype(input_dtype)
    narrow = jnp.dtype(jnp.bfloat16) if input_dtype.itemsize == 2 else input_dtype
    return SlotProducts(*(Products(narrow, input_dtype, wide)
                          for wide in _WIDE[st.blocks.slot_precision]))


def slot_rows(st: Static, rows: jax.Array, holds: jax.Array | None = None) -> jax.Array:
    """`[R, 1]` bool: the query rows whose slots hold a token of their document. rows `[R, 1]`
    are query positions; holds: the loaded `[R]` int32 row flags (with documents), else the
    rule t ≥ w."""
    if holds is not None:
        return holds[:, None] != 0
    return rows >= st.window


def in_softmax(st: Static, held: jax.Array) -> jax.Array:
    """Rows whose softmax includes the M slot logits: those whose slots hold something (masked
    empty slots), or every row (zero-value sinks, whose logits are then 0)."""
    return held if st.mask_empty else jnp.ones_like(held)


def stream_chunk(st: Static, c, num_chunks: int):
    """Token chunk read by stream chunk c (the slot inputs enter w = D·C steps late)."""
    return lax.rem(c + num_chunks - st.shift_chunks, num_chunks)


def stream_rows_valid(st: Static, c: jax.Array) -> Callable[[int, int], jax.Array]:
    """`valid(start, size)`: which rows start..start+size−1 of stream chunk c (this program's)
    hold a slot input entering during the call: not in one of the D empty leading chunks, and
    at a stream step < T (padded steps write and decay nothing)."""
    C = st.blocks.chunk

    def valid(start: int, size: int) -> jax.Array:
        ok = c >= st.shift_chunks
        if st.length is not None:
            ok = ok & (c * C + start + iota((size, 1), 0) < st.length)
        return ok

    return valid


def masked(rows: Rows, valid: Callable[[int, int], jax.Array]) -> Rows:
    return lambda start, size: jnp.where(valid(start, size), rows(start, size), 0)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where time and heads sit, and the backend's kernel parameters.

    head_major: arrays are `[B, H, T, d]` (TPU) rather than `[B, T, H, d]` (GPU).
    params: `(st, num_warps, num_grid_axes, sequential_last, num_stages)` → compiler params.
    interpret: `st` → the `interpret=` argument of `pallas_call`.
    cumsum / reverse_cumsum: in-kernel inclusive (reverse) cumulative sums over rows of a
      float32 `[C, M]` tile.
    split_paths: each slot kernel runs twice, over the chunks on the fast path and then over
      those on the exact path, each kernel holding one path's code (GPU: the exact path's code
      in the same kernel cost the fast path registers, `slot_kernels._call`); else one kernel
      picks the path per chunk (TPU: a program that skips its chunk would still write its
      output block back).
    """

    head_major: bool
    params: Callable[..., Any]
    interpret: Callable[[Static], Any]
    cumsum: Callable[[jax.Array], jax.Array]
    reverse_cumsum: Callable[[jax.Array], jax.Array]
    split_paths: bool

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
        """Rows of query head r of a `grouped_seq` block (all features, or the slice `cols`)."""
        if self.head_major:
            return lambda start, size, cols=slice(None): ref[r, pl.ds(start, size), cols]
        return lambda start, size, cols=slice(None): ref[pl.ds(start, size), r, cols]

    def rows_spec(self, rows: int, index: Callable) -> pl.BlockSpec:
        """Block of `rows` steps of a per-row array (log-sum-exp, D) in `row_vectors` form;
        index maps the grid to (batch, head, time block)."""
        if self.head_major:
            return pl.BlockSpec((None, None, 1, rows),
                                lambda *grid: _place(index(*grid), (0, 1, 3)))
        return pl.BlockSpec((None, None, rows), lambda *grid: index(*grid))

    def row_vectors(self, x: jax.Array) -> jax.Array:
        """A per-row `[B, H, T]` array as the kernels take it: `[B, H, 1, T]` when head-major
        (TPU: a block's second-to-last axis must be whole or a multiple of 8, so a `(1, rows)`
        block of a one-row axis)."""
        return x[:, :, None, :] if self.head_major else x

    def rows_shape(self, batch: int, heads: int, length: int) -> tuple[int, ...]:
        """The shape of a per-row array in `row_vectors` form."""
        return (batch, heads, 1, length) if self.head_major else (batch, heads, length)

    def tokens_spec(self, rows: int, index: Callable) -> pl.BlockSpec:
        """Block of `rows` steps of a per-token array (documents) in `token_vectors` form;
        index maps the grid to (batch, time block)."""
        if self.head_major:
            return pl.BlockSpec((None, 1, rows), lambda *grid: _place(index(*grid), (0, 2), 3))
        return pl.BlockSpec((None, rows), lambda *grid: index(*grid))

    def token_vectors(self, x: jax.Array) -> jax.Array:
        """A per-token `[B, T]` array as the kernels take it: `[B, 1, T]` when head-major (the
        TPU's block rule, as for `row_vectors`)."""
        return x[:, None, :] if self.head_major else x

    def token_rows(self, ref, start: int, size: int) -> jax.Array:
        """Steps start..start+size−1 of a `tokens_spec` block, `[size]`."""
        return ref[0, pl.ds(start, size)] if self.head_major else ref[pl.ds(start, size)]

    def column(self, ref) -> jax.Array:
        """A `rows_spec` block as a `[rows, 1]` column (a row's value against its row)."""
        return (ref[0, :] if self.head_major else ref[...])[:, None]

    def set_column(self, ref, column: jax.Array) -> None:
        """Writes a `[rows, 1]` column to a `rows_spec` block."""
        ref[...] = column.reshape(1, -1) if self.head_major else column[:, 0]


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
