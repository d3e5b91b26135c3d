"""The short causal depthwise convolution of the mixers (GDN's q/k/v, Mamba's x/B/C convs):

    y_t = act(b + Σ_{i<K} w_i ⊙ x_{t−i})

per channel, in float32, where an input before the row or of another document (segment ids)
counts as zero, so packed sequences do not leak; act is SiLU or none. Rungs: "pallas" (the
kernels of `pallas_kernels/short_conv`, GPUs only, chosen automatically there: 1.1-1.6x the
XLA rung at the models' shapes, BENCHMARKS.md) and "xla" (K shifted multiply-adds that XLA
fuses). y has x's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_dims, check_floating, check_integer
from hybrid_jax.ops.dispatch import Rung, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.partition import shard_kernel
from pallas_kernels.short_conv import api as pallas_short_conv

_OP = "short_conv"


@typed_like_inputs
def short_conv(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None = None,
    *,
    segment_ids: jax.Array | None = None,
    activation: bool = False,
    head_channels: bool = False,
    implementation: str | None = None,
) -> jax.Array:
    """The convolution over whole sequences.

    Args:
      x: `[B, T, C]` inputs.
      weight: `[K, C]` taps (any K >= 1; the "pallas" rung takes K <= 8), `weight[i]`
        multiplying x_{t−i}.
      bias: `[C]` added before the activation, or None.
      segment_ids: `[B, T]` packed-document ids, or None.
      activation: SiLU after the sum.
      head_channels: the channels are heads (× head dims) that the `tensor` mesh axis splits,
        as in `hybrid_jax.sharding`; the "pallas" rung then runs on each device's channels.
        Else every device convolves all of them (on its batch rows).
      implementation: "xla", "pallas" or None (auto: "pallas" on a GPU where the kernels take
        the call, else "xla"; a GPU fallback is logged once per shape with its reason).

    Returns:
      `[B, T, C]` in x's dtype.
    """
    optional = dict(bias=(bias, "C"), segment_ids=(segment_ids, "BT"))
    sizes = check_dims(_OP, {}, x=(x, "BTC"), weight=(weight, "KC"),
                       **{name: a for name, a in optional.items() if a[0] is not None})
    check_integer(_OP, segment_ids=segment_ids)
    check_floating(_OP, x=x, weight=weight, bias=bias)
    if sizes["K"] < 1:
        raise ValueError(f"{_OP}: weight needs at least one tap, got shape {weight.shape}")
    return dispatch(_OP, _RUNGS, implementation, x, weight, bias, segment_ids=segment_ids,
                    activation=activation, head_channels=head_channels)


def short_conv_xla(x, weight, bias, *, segment_ids, activation, head_channels):
    """K shifted multiply-adds, recomputed in the backward from x (`jax.checkpoint`): autodiff
    would keep ≈ 3K float32 copies of x (the shifted, masked inputs, the sum, SiLU's terms;
    gdn-340m's three convs: 86 KB a token and layer) until then."""
    del head_channels  # XLA partitions the elementwise work itself
    return _conv_sum(x, weight, bias, segment_ids, activation)


@functools.partial(jax.checkpoint, static_argnums=(4,))
def _conv_sum(x, weight, bias, segment_ids, activation: bool):
    dtype, length = x.dtype, x.shape[1]
    weight = weight.astype(jnp.float32)
    x = x.astype(jnp.float32)
    y = x * weight[0]
    for lag in range(1, min(weight.shape[0], length + 1)):
        shifted = jnp.pad(x, ((0, 0), (lag, 0), (0, 0)))[:, :length]
        if segment_ids is not None:
            prev = jnp.pad(segment_ids, ((0, 0), (lag, 0)), constant_values=-1)
            same = (prev[:, :length] == segment_ids)[..., None]
            shifted = jnp.where(same, shifted, 0.0)
        y = y + shifted * weight[lag]
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return (jax.nn.silu(y) if activation else y).astype(dtype)


def short_conv_pallas(x, weight, bias, *, segment_ids, activation, head_channels):
    """The kernels on each device's batch rows (and channels, with `head_channels`)."""
    c = "H" if head_channels else "C"  # `partition`'s letter for a split axis, or a kept one

    def kernel(x, weight, bias, segment_ids):
        return pallas_short_conv.short_conv(x, weight, bias, segment_ids=segment_ids,
                                            activation=activation)

    return shard_kernel(_OP, kernel, (x, weight, bias, segment_ids),
                        ("BT" + c, "K" + c, c, "BT"), "BT" + c)


def _pallas_unsupported(x, weight, bias, *, segment_ids, activation, head_channels):
    return pallas_short_conv.unsupported(x, weight, bias, segment_ids)


_RUNGS = (
    # Checked and timed on an H200 (`experiments/benchmarks/short_conv.py`, session 9).
    Rung("pallas", short_conv_pallas, _pallas_unsupported, platforms=("gpu",)),
    Rung("xla", short_conv_xla),
)
