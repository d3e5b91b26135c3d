"""RMSNorm and the SiLU-gated RMSNorm over groups of channels (the norms of every block and
Gated DeltaNet's / Mamba-2's output norms):

    rms_norm:        y = n(x)·γ
    gated_rms_norm:  y = n(x)·γ·silu(z)  (norm_before_gate)  or  y = n(x·silu(z))·γ

with n(a) = a / √(mean(a²) + ε) over each group of `group_size` consecutive channels of the
last axis, in float32; y in `dtype`. Rungs: "pallas" (the kernels of `pallas_kernels/rms_norm`,
GPUs only, auto there since their H200 check and timing: `experiments/benchmarks/rms_norm.py`)
and "xla" (the float32 math that XLA fuses, recomputed in the backward from the inputs). Both
keep only x, z and γ for the backward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_count, check_floating, check_floating_dtype
from hybrid_jax.ops.dispatch import Rung, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.partition import row_layout, shard_kernel
from pallas_kernels.rms_norm import api as pallas_rms_norm


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """`x / √(mean(x²) + ε)` over the last axis, in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


@typed_like_inputs
def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6, dtype=None,
             implementation: str | None = None) -> jax.Array:
    """`n(x)·γ` over the last axis.

    Args:
      x: `[..., C]`.
      scale: `[C]` γ.
      eps: ε added to the mean square.
      dtype: y's dtype (default x's).
      implementation: "xla", "pallas" or None (auto: "pallas" on a GPU where it can run,
        else "xla"; a GPU fallback is logged once per shape with its reason).
    """
    return _norm("rms_norm", x, None, scale, None, True, eps, dtype, implementation)


@typed_like_inputs
def gated_rms_norm(x: jax.Array, z: jax.Array, scale: jax.Array, *,
                   group_size: int | None = None, norm_before_gate: bool = True,
                   eps: float = 1e-6, dtype=None, implementation: str | None = None
                   ) -> jax.Array:
    """RMSNorm with a SiLU gate over groups of `group_size` channels.

    Args:
      x: `[..., C]`.
      z: the gate, x's shape.
      scale: `[C]` γ.
      group_size: channels per group, dividing C (default C).
      norm_before_gate: `n(x)·γ·silu(z)` (Gated DeltaNet); else `n(x·silu(z))·γ` (Mamba-2).
      eps, dtype, implementation: as `rms_norm`.
    """
    return _norm("gated_rms_norm", x, z, scale, group_size, norm_before_gate, eps, dtype,
                 implementation)


def _norm(op, x, z, scale, group_size, norm_before_gate, eps, dtype, implementation):
    check_floating(op, x=x, z=z, scale=scale)
    channels = x.shape[-1] if x.ndim else None
    if x.ndim < 1 or scale.shape != (channels,):
        raise ValueError(f"{op}: scale must have shape [C] = [{channels}] (x's last axis, x "
                         f"shape {tuple(x.shape)}), got {tuple(scale.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"{op}: z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    group_size = channels if group_size is None else group_size
    check_count(op, "group_size", group_size, 1)
    if channels % group_size:
        raise ValueError(f"{op}: group_size={group_size} does not divide the channels "
                         f"C={channels} (x shape {tuple(x.shape)})")
    # The dtype travels by name (the dispatcher's log takes anything with a shape for an array).
    dtype = jnp.dtype(x.dtype if dtype is None else dtype).name
    check_floating_dtype(op, "dtype", dtype)
    return dispatch(op, _RUNGS, implementation, x, z, scale, group_size=group_size,
                    norm_before_gate=bool(norm_before_gate), eps=float(eps), dtype=dtype)


def rms_norm_xla(x, z, scale, *, group_size, norm_before_gate, eps, dtype):
    """The float32 math, recomputed in the backward from the inputs (`jax.checkpoint`)."""
    dtype = jnp.dtype(dtype)
    if z is None:
        return _rms_norm(x, scale, eps, dtype)
    return _gated_rms_norm(x, z, scale, group_size, norm_before_gate, eps, dtype)


@functools.partial(jax.checkpoint, static_argnums=(2, 3))
def _rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype) -> jax.Array:
    """Recomputed in the backward from x and γ: autodiff of the float32 math would keep two
    float32 copies of x (4× a bf16 activation) until then."""
    return (rms_normalize(x, eps) * scale.astype(jnp.float32)).astype(dtype)


@functools.partial(jax.checkpoint, static_argnums=(3, 4, 5, 6))
def _gated_rms_norm(x, z, scale, group_size: int, norm_before_gate: bool, eps: float, dtype):
    """Recomputed in the backward from x, z and γ: autodiff of the float32 math would keep
    about six float32 copies of x (12× a bf16 activation; gdn-340m's output norm: 37 KB a
    token and layer) until then."""
    gate = jax.nn.silu(z.astype(jnp.float32))
    x32 = x.astype(jnp.float32)
    if not norm_before_gate:
        x32 = x32 * gate
    groups = x32.reshape(*x32.shape[:-1], -1, group_size)
    y = rms_normalize(groups, eps).reshape(x32.shape) * scale.astype(jnp.float32)
    if norm_before_gate:
        y = y * gate
    return y.astype(dtype)


def rms_norm_pallas(x, z, scale, *, group_size, norm_before_gate, eps, dtype):
    """The kernels on each device's batch rows, its sequence shard (the rows are independent:
    under context parallelism each device normalises its own tokens) and heads, for
    `[B, T, H, C]` inputs."""
    if x.ndim < 2:
        return _kernel(x, z, scale, group_size, norm_before_gate, eps, dtype)
    layout = "BSHC" if x.ndim == 4 else row_layout(x.ndim - 1) + "C"
    kernel = functools.partial(_kernel, group_size=group_size,
                               norm_before_gate=norm_before_gate, eps=eps, dtype=dtype)
    return shard_kernel("rms_norm", kernel, (x, z, scale), (layout, layout, "C"), layout)


def _kernel(x, z, scale, group_size, norm_before_gate, eps, dtype):
    return pallas_rms_norm.rms_norm(x, scale, z, group_size=group_size,
                                    norm_before_gate=norm_before_gate, eps=eps,
                                    dtype=jnp.dtype(dtype))


def _pallas_unsupported(x, z, scale, *, group_size, norm_before_gate, eps, dtype):
    return pallas_rms_norm.unsupported(x, scale, z, group_size=group_size,
                                       dtype=jnp.dtype(dtype))


_RUNGS = (
    # H200 (session 15, `experiments/benchmarks/rms_norm.py --parts check,table`): within
    # bf16's rounding, 1.2-1.9x the XLA rung's fwd+bwd (pallas_kernels/rms_norm/NOTES.md).
    Rung("pallas", rms_norm_pallas, _pallas_unsupported, platforms=("gpu",)),
    Rung("xla", rms_norm_xla),
)
