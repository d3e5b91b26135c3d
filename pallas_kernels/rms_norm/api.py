"""RMSNorm and the SiLU-gated RMSNorm with Pallas kernels: entry point, support checks, custom
VJP.

    plain:                    y = n(x)·γ
    gated, norm_before_gate:  y = n(x)·γ·silu(z)       (Gated DeltaNet's output norm)
    gated, otherwise:         y = n(x·silu(z))·γ       (Mamba-2's grouped norm)

with n(a) = a / √(mean(a²) + ε) over each group of `group_size` consecutive channels of the
last axis. x `[..., C]`, z x's shape or None, γ `[C]`. Math in float32; y in `dtype` (default
x's). This is the contract of `hybrid_jax.ops.rms_norm` / `gated_rms_norm`, whose "pallas" rung
calls `rms_norm` here. The backward saves only the inputs (the norm is recomputed from them);
dγ is summed in float32 over the rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.gpu_elementwise import DTYPES, unsupported_arrays
from pallas_kernels.residuals import saved
from pallas_kernels.rms_norm import gpu
from pallas_kernels.rms_norm.block_sizes import BlockSizes, default_block_sizes, padded
from pallas_kernels.vma import varying_like

MAX_GROUP = 8192  # a program holds a whole group in registers


def rms_norm(
    x: jax.Array,
    scale: jax.Array,
    z: jax.Array | None = None,
    *,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    eps: float = 1e-6,
    dtype=None,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
) -> jax.Array:
    """The norm, differentiable in x, scale and z.

    Args:
      x: `[..., C]` inputs.
      scale: `[C]` γ.
      z: the gate, x's shape, or None (plain RMSNorm).
      group_size: channels per group (dividing C; default C, one group).
      norm_before_gate: with z, `n(x)·γ·silu(z)`; else `n(x·silu(z))·γ`.
      eps: ε added to the mean square.
      dtype: y's dtype (default x's).
      block_sizes: tiles (default `default_block_sizes(group_size, gated)`).
      interpret: run the kernels in Pallas interpret mode (CPU tests).

    Returns:
      x's shape in `dtype`.
    """
    reason = unsupported(x, scale, z, group_size=group_size, dtype=dtype, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas rms_norm: {reason}")
    channels = x.shape[-1]
    group_size = channels if group_size is None else group_size
    st = gpu.Static(group_size=group_size, gated=z is not None,
                    norm_before_gate=bool(norm_before_gate), eps=float(eps),
                    dtype=jnp.dtype(x.dtype if dtype is None else dtype),
                    blocks=block_sizes or default_block_sizes(group_size, z is not None),
                    interpret=interpret)
    flat = lambda a: None if a is None else a.reshape(-1, channels)
    (scale,) = varying_like((scale,), x, z)
    return _norm(st, flat(x), scale, flat(z)).reshape(x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _norm(st, x, scale, z):
    return gpu.forward(x, scale, z, st)


def _norm_fwd(st, x, scale, z):
    (y,) = saved(gpu.forward(x, scale, z, st))
    return y, (x, scale, z)


def _norm_bwd(st, residuals, dy):
    x, scale, z = residuals
    dx, dscale, *dz = gpu.backward(x, scale, z, dy, st)
    return dx, dscale.sum(0).astype(scale.dtype), dz[0] if dz else None


_norm.defvjp(_norm_fwd, _norm_bwd)


def unsupported(x, scale, z=None, *, group_size=None, dtype=None,
                interpret=False) -> str | None:
    """None when the kernels can run this call, else what is wrong (shapes, group, dtypes,
    platform). `interpret`: no accelerator limits (any floating dtype, any platform)."""
    if x.ndim < 1 or scale.ndim != 1:
        return (f"expected x [..., C] and scale [C], got shapes {tuple(x.shape)} and "
                f"{tuple(scale.shape)}")
    if x.size == 0:
        return f"x must not be empty, got shape {tuple(x.shape)}"
    channels = x.shape[-1]
    if scale.shape != (channels,):
        return f"scale must be [{channels}] (x's channels), got {tuple(scale.shape)}"
    if z is not None and z.shape != x.shape:
        return f"z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}"
    size = channels if group_size is None else group_size
    if size < 1 or channels % size:
        return f"group_size must divide the channels {channels}, got {group_size}"
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        return f"dtype must be floating, got {jnp.dtype(dtype)}"
    reason = unsupported_arrays(dict(x=x, scale=scale, z=z), interpret)
    if reason is not None or interpret:
        return reason
    if dtype is not None and jnp.dtype(dtype) not in DTYPES:
        return f"dtype {jnp.dtype(dtype)}: the kernels write bfloat16, float16, float32"
    if padded(size) > MAX_GROUP:
        return f"group_size must be at most {MAX_GROUP} (a group in one program), got {size}"
    return None
