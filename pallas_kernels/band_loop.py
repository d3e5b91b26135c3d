"""A loop over a band of blocks whose interior needs no mask (flash-attention style kernels).

Attention kernels visit, per query (key) block, the key (query) blocks of a band. Only the
blocks at the band's edges hold pairs outside the causal triangle, the window or a document;
the blocks between them are visible in full, and a loop over them builds no mask (no iota,
compare or select an element). `band_loop` runs the band in three parts, masked / unmasked /
masked, from the band [lo, hi) and its interior [full_lo, full_hi) (clipped into the band, so
an empty or inverted interior leaves every block masked).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax


def band_loop(lo, hi, full_lo, full_hi, visit, carry, causal_part=None):
    """`visit(i, carry, mask)` over [lo, hi): mask None (no test) for i in [full_lo, full_hi),
    else "full" (every test). causal_part "last" (query blocks: the key blocks after the
    interior are inside every row's run and window) or "first" (key blocks: the query blocks
    before the interior see the block's keys within their runs and windows) gives that part
    mask "causal": the causal test alone."""
    a = jnp.clip(full_lo, lo, hi)
    b = jnp.clip(full_hi, a, hi)
    parts = [(lo, a, "full"), (a, b, None), (b, hi, "causal" if causal_part == "last" else "full")]
    if causal_part == "first":
        c = jnp.clip(full_hi, lo, a)
        parts[:1] = [(lo, c, "causal"), (c, a, "full")]
    for start, stop, mask in parts:
        carry = lax.fori_loop(start, stop, functools.partial(visit, mask=mask), carry)
    return carry


def ceil_div(x, block: int):
    """⌈x / block⌉ for x ≥ 0 (int32 arrays)."""
    return lax.div(x + block - 1, block)
