"""The logit-statistics kernel for NVIDIA GPUs: Pallas with the Triton lowering (testable in
interpret mode on CPU).

`[N, V]` logits (any float dtype, read as float32) and `[N]` targets. A program owns
`block_rows` rows and walks their vocabulary in tiles of `block_vocab` columns. Each lane (a
column of the tile: the row's columns j ≡ lane mod `block_vocab`) carries its own statistics,
updated elementwise, so a step has no reduction across lanes: the maximum of its non-NaN logits
and the first column where it occurs, Σ exp(l − mf) over its finite logits with mf their
running maximum (one exponential a logit: e^{−|l − mf|} scales the sum or is added to it), the
first NaN column, and the target's logit where the target falls in the lane. The lanes are
combined once, after the loop. Every ref is the whole array in global memory, read with masked
loads (columns past V and rows past N read as −∞), so nothing is padded in XLA.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.base2 import LOG2E
from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.gpu_elementwise import iota
from pallas_kernels.logit_stats.block_sizes import BlockSizes

F32 = jnp.float32
_NONE = 2**31 - 1  # "no column": larger than any column index


@dataclasses.dataclass(frozen=True)
class Static:
    blocks: BlockSizes
    interpret: bool


def _exp(x):
    # exp2 is one `ex2.approx` on the GPU (`exp` lowers to libdevice's range-reduced expf).
    return jnp.exp2(x * LOG2E)


def _kernel(logits_ref, targets_ref, top_ref, best_ref, sum_ref, target_ref, *, st: Static):
    BR, BV = st.blocks.block_rows, st.blocks.block_vocab
    num_rows, vocab = logits_ref.shape
    rows = pl.program_id(0) * BR + iota((BR, 1), 0)
    row_ok = rows < num_rows
    target = pltriton.load(targets_ref.at[rows[:, 0]], mask=row_ok[:, 0], other=0)[:, None]
    # A negative target counts from the end, as take_along_axis's index does.
    target = jnp.where(target < 0, target + vocab, target)
    lanes = iota((BR, BV), 1)

    def load(j):
        cols = j * BV + lanes
        return pltriton.load(logits_ref.at[rows, cols], mask=row_ok & (cols < vocab),
                             other=-jnp.inf)

    def update(j, x, carry):
        top, first, finite_max, sum_exp, first_nan, picked = carry
        cols = j * BV + lanes
        x = x.astype(F32)
        larger = x > top  # False for NaN; ties keep the earlier column
        first = jnp.where(larger, cols, first)
        top = jnp.where(larger, x, top)
        finite = jnp.abs(x) < jnp.inf
        e = _exp(-jnp.abs(x - finite_max))  # e^{finite_max − x} or e^{x − finite_max}
        grows = finite & (x > finite_max)
        sum_exp = jnp.where(grows, sum_exp * e + 1.0, jnp.where(finite, sum_exp + e, sum_exp))
        finite_max = jnp.where(grows, x, finite_max)
        first_nan = jnp.where((x != x) & (first_nan == _NONE), cols, first_nan)
        picked = picked + jnp.where(cols == target, x, 0.0)
        return top, first, finite_max, sum_exp, first_nan, picked

    lowest = jnp.full((BR, BV), -jnp.inf, F32)
    zeros = jnp.zeros((BR, BV), F32)
    carry = (lowest, lanes, lowest, zeros, jnp.full((BR, BV), _NONE, jnp.int32), zeros)
    steps = pl.cdiv(vocab, BV)
    if st.blocks.prefetch:
        def step(j, state):
            x, carry = state
            ahead = load(j + 1)  # the last step's read is masked off (columns past V)
            return ahead, update(j, x, carry)

        _, carry = lax.fori_loop(0, steps, step, (load(0), carry))
    else:
        carry = lax.fori_loop(0, steps, lambda j, c: update(j, load(j), c), carry)
    top, first, finite_max, sum_exp, first_nan, picked = carry
    # The lanes combined: an all −∞ row's maximum is −∞ at column 0 (lane 0's first).
    row_top = jnp.max(top, axis=1, keepdims=True)
    best = jnp.min(jnp.where(top == row_top, first, _NONE), axis=1, keepdims=True)
    row_finite_max = jnp.max(finite_max, axis=1, keepdims=True)
    # (A lane without finite logits adds 0·e^{−∞}; without any in the row, the cases below.)
    row_sum = jnp.sum(sum_exp * _exp(finite_max - row_finite_max), axis=1, keepdims=True)
    # The loss's shift is the maximum where finite, else 0: a +∞ logit makes Σ exp ∞, a row
    # with nothing above −∞ sums to 0.
    row_sum = jnp.where(row_top == jnp.inf, jnp.inf, jnp.where(row_top == -jnp.inf, 0.0,
                                                                row_sum))
    nan_col = jnp.min(first_nan, axis=1, keepdims=True)
    has_nan = nan_col < _NONE  # NaN is the largest: the maximum, and Σ exp is NaN
    nan = jnp.full_like(row_top, jnp.nan)
    picked = jnp.sum(picked, axis=1, keepdims=True)
    stores = ((top_ref, jnp.where(has_nan, nan, row_top)),
              (best_ref, jnp.where(has_nan, nan_col, best)),
              (sum_ref, jnp.where(has_nan, nan, row_sum)),
              (target_ref, jnp.where((target >= 0) & (target < vocab), picked, nan)))
    for ref, value in stores:
        pltriton.store(ref.at[rows[:, 0]], value[:, 0].astype(ref.dtype), mask=row_ok[:, 0])


def logit_stats(logits: jax.Array, targets: jax.Array, st: Static):
    """(top, best, sum_exp, target_logit), each `[N]` (best int32, the others float32)."""
    num_rows = logits.shape[0]
    row = lambda dtype: jax.ShapeDtypeStruct((num_rows,), dtype)
    return pallas_call(
        functools.partial(_kernel, st=st),
        grid=(pl.cdiv(num_rows, st.blocks.block_rows),),
        out_shape=(row(F32), row(jnp.int32), row(F32), row(F32)),
        compiler_params=triton_params(st.blocks.num_warps),
        interpret=st.interpret, name="logit_stats",
    )(logits, targets.astype(jnp.int32))
