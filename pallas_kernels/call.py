"""`pallas_call`: `pl.pallas_call` that also runs inside `jax.shard_map` (context parallelism);
`triton_params`: the GPU kernels' compiler parameters.

Under `shard_map`'s type check (`check_vma=True`, always on in this library) Pallas needs each
output's varying mesh axes stated on its `out_shape`; a plain `jax.ShapeDtypeStruct` fails the
trace. Here every output varies over the union of the axes its inputs vary over (a kernel's
output depends on all of its inputs), which is also what it is outside `shard_map` (none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.vma import varying_axes

# (A JAX without it, an older one, keeps plain shapes: kernels then run outside shard_map only.)
_MANUAL_AXIS_TYPE = getattr(jax.sharding, "ManualAxisType", None)


def _varying_like(out_shape: Any, axes: frozenset) -> Any:
    if _MANUAL_AXIS_TYPE is None:
        return out_shape
    mat = _MANUAL_AXIS_TYPE(varying=axes)
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, manual_axis_type=mat)
        if isinstance(s, jax.ShapeDtypeStruct) else s, out_shape)


def pallas_call(kernel: Callable, *, out_shape: Any, **kwargs: Any) -> Callable:
    """`pl.pallas_call(kernel, out_shape=out_shape, **kwargs)`, with the outputs varying over the
    manual mesh axes of the inputs it is called on (none outside `shard_map`)."""

    def call(*args):
        shapes = _varying_like(out_shape, varying_axes(args))
        return pl.pallas_call(kernel, out_shape=shapes, **kwargs)(*args)

    return call


def triton_params(num_warps: int, num_stages: int = 1) -> pltriton.CompilerParams:
    """Compiler parameters of a kernel on Pallas' Triton lowering (the GPU kernels)."""
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
