"""The LM head's projection: float32 logits, with a backward in the compute dtype.

`logits = x · W` takes compute-dtype operands (bf16) and accumulates in float32, so the loss
gets float32 logits. Differentiated as is, the float32 cotangent of those logits meets the
bf16 operands in both backward products (dx = g·W, dW = gᵀ·x), and XLA runs a float32 × bf16
product as a float32 gemm (on the H200, TF32 gemms: 10.6 ms of the 125M model's 89 ms step,
2026-12-01, against 2.3 ms for the bf16 forward product). Here the cotangent is cast to the
compute dtype first (what PyTorch's autocast does), and both products accumulate in float32;
dx and dW come back in the dtypes of x and W (a float32 table gets its gradient unrounded).
With a float32 compute dtype this is the plain product and its plain gradients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_jax.ops.checks import check_floating, check_floating_dtype
from pallas_kernels import vma


def logits(x_BTD: jax.Array, weight: jax.Array, *, vocab_axis: int, dtype) -> jax.Array:
    """`[..., D] · W` as float32 `[..., V]`; `weight` is `[V, D]` (vocab_axis 0: a tied
    embedding table) or `[D, V]` (vocab_axis 1: an output kernel). Operands are cast to
    `dtype`; the backward casts the logits' cotangent to `dtype` too (module docstring)."""
    check_floating("logits", x=x_BTD, weight=weight)
    check_floating_dtype("logits", "dtype", dtype)  # operands cast to an integer dtype: garbage
    if x_BTD.ndim < 1 or weight.ndim != 2 or vocab_axis not in (0, 1):
        raise ValueError(f"logits: expected x [..., D], a 2-D weight and vocab_axis 0 or 1, got "
                         f"x shape {x_BTD.shape}, weight shape {weight.shape} and vocab_axis "
                         f"{vocab_axis}")
    if x_BTD.shape[-1] != weight.shape[1 - vocab_axis]:
        raise ValueError(f"logits: x's last axis {x_BTD.shape[-1]} must equal the weight's model "
                         f"axis, weight shape {weight.shape} (vocab_axis {vocab_axis})")
    return _logits(x_BTD, weight, vocab_axis, jnp.dtype(dtype))


def _product(x, w, vocab_axis):
    return lax.dot_general(x, w, (((x.ndim - 1,), (1 - vocab_axis,)), ((), ())),
                           preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _logits(x, weight, vocab_axis, dtype):
    return _product(x.astype(dtype), weight.astype(dtype), vocab_axis)


def _logits_fwd(x, weight, vocab_axis, dtype):
    return _logits(x, weight, vocab_axis, dtype), (x, weight)


def _logits_bwd(vocab_axis, dtype, residuals, g):
    x, weight = residuals
    g, xc, wc = g.astype(dtype), x.astype(dtype), weight.astype(dtype)
    dx = lax.dot_general(g, wc, (((g.ndim - 1,), (vocab_axis,)), ((), ())),
                         preferred_element_type=jnp.float32)
    tokens = tuple(range(g.ndim - 1))  # every axis but the last, summed over for dW
    pair = (g, xc) if vocab_axis == 0 else (xc, g)
    dw = lax.dot_general(*pair, ((tokens, tokens), ((), ())), preferred_element_type=jnp.float32)
    return (vma.cotangent_for(dx.astype(x.dtype), x),
            vma.cotangent_for(dw.astype(weight.dtype), weight))


_logits.defvjp(_logits_fwd, _logits_bwd)
