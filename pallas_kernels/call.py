"""`pallas_call`: `pl.pallas_call` that also runs inside `jax.shard_map` (context parallelism).

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


def _varying(args: tuple) -> frozenset:
    axes: frozenset = frozenset()
    for x in jax.tree.leaves(args):
        if isinstance(x, jax.Array):
            axes |= jax.typeof(x).manual_axis_type.varying
    return axes


def _varying_like(out_shape: Any, axes: frozenset) -> Any:
    mat = jax.sharding.ManualAxisType(varying=axes)
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, manual_axis_type=mat)
        if isinstance(s, jax.ShapeDtypeStruct) else s, out_shape)


def pallas_call(kernel: Callable, *, out_shape: Any, **kwargs: Any) -> Callable:
    """`pl.pallas_call(kernel, out_shape=out_shape, **kwargs)`, with the outputs varying over the
    manual mesh axes of the inputs it is called on."""

    def call(*args):
        shapes = _varying_like(out_shape, _varying(args))
        return pl.pallas_call(kernel, out_shape=shapes, **kwargs)(*args)

    return call
