"""The short causal depthwise convolution with Pallas kernels: entry point, support checks,
custom VJP.

    y_t = act(b + Σ_{i<K} w_i ⊙ x_{t−i})    (x_{t−i} = 0 before the row or in another document)

x `[B, T, C]`, w `[K, C]` (K = size ≤ `MAX_SIZE`), b `[C]` or None, act SiLU or none,
segment ids `[B, T]` int or None (one document per row). Sums in float32; y has x's dtype.
This is the contract of `hybrid_jax.ops.short_conv`, whose "pallas" rung calls `short_conv`
here. The backward saves only the inputs (the pre-activation is recomputed); dw and db are
summed in float32 over the batch and time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.gpu_elementwise import unsupported_arrays
from pallas_kernels.residuals import saved
from pallas_kernels.short_conv import gpu
from pallas_kernels.short_conv.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.vma import varying_like

MAX_SIZE = 8


def short_conv(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    *,
    activation: bool = False,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
) -> jax.Array:
    """The convolution, differentiable in x, weight and bias.

    Args:
      x: `[B, T, C]` inputs.
      weight: `[K, C]` taps, `weight[i]` multiplying x_{t−i}; 1 ≤ K ≤ `MAX_SIZE`.
      bias: `[C]`, or None.
      segment_ids: `[B, T]` integer document ids, or None.
      activation: apply SiLU to the sum.
      block_sizes: tiles (default `default_block_sizes()`).
      interpret: run the kernels in Pallas interpret mode (CPU tests).

    Returns:
      `[B, T, C]` in x's dtype.
    """
    reason = unsupported(x, weight, bias, segment_ids, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas short_conv: {reason}")
    st = gpu.Static(size=weight.shape[0], activation=activation, bias=bias is not None,
                    documents=segment_ids is not None,
                    blocks=block_sizes or default_block_sizes(), interpret=interpret)
    if segment_ids is not None:
        segment_ids = segment_ids.astype(jnp.int32)
    return _conv(st, x, *varying_like((weight, bias), x), segment_ids)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv(st, x, weight, bias, segment_ids):
    return gpu.forward(x, weight, bias, segment_ids, st)


def _conv_fwd(st, x, weight, bias, segment_ids):
    (y,) = saved(gpu.forward(x, weight, bias, segment_ids, st))
    return y, (x, weight, bias, segment_ids)


def _conv_bwd(st, residuals, dy):
    x, weight, bias, segment_ids = residuals
    dx, dw, *db = gpu.backward(x, weight, bias, segment_ids, dy.astype(x.dtype), st)
    dw = dw.sum((0, 1)).astype(weight.dtype)
    db = db[0].sum((0, 1)).astype(bias.dtype) if db else None
    return dx, dw, db, None


_conv.defvjp(_conv_fwd, _conv_bwd)


def unsupported(x, weight, bias=None, segment_ids=None, *, interpret=False) -> str | None:
    """None when the kernels can run this call, else what is wrong (shapes, sizes, dtypes,
    platform). `interpret`: no accelerator limits (any floating dtype, any platform)."""
    if x.ndim != 3 or weight.ndim != 2:
        return (f"expected x [B, T, C] and weight [K, C], got shapes {x.shape} and "
                f"{weight.shape}")
    batch, length, channels = x.shape
    size = weight.shape[0]
    if x.size == 0:
        return f"x must not be empty, got shape {x.shape}"
    if weight.shape[1] != channels:
        return f"weight must be [K, {channels}] (x's channels), got {weight.shape}"
    if not 1 <= size <= MAX_SIZE:
        return f"size K (weight.shape[0]) must be in 1..{MAX_SIZE}, got {size}"
    if bias is not None and bias.shape != (channels,):
        return f"bias must be [{channels}] (x's channels) or None, got {bias.shape}"
    if segment_ids is not None and (segment_ids.shape != (batch, length)
                                    or not jnp.issubdtype(segment_ids.dtype, jnp.integer)):
        return (f"segment_ids must be integer [{batch}, {length}], got {segment_ids.dtype} "
                f"{segment_ids.shape}")
    return unsupported_arrays(dict(x=x, weight=weight, bias=bias), interpret)
