"""`pallas_call` for every kernel here: inside `jax.shard_map` its outputs vary over the mesh
axes its inputs vary over.

`jax.shard_map` checks which manual mesh axes every value varies over (`check_vma`); a
`pallas_call` there needs that type on each of its out shapes (`manual_axis_type`), since it
cannot infer it from the kernel. A kernel computes each output from its inputs on one device,
so its outputs vary wherever any input does. Outside `shard_map` this is `pl.pallas_call`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import pallas as pl


def pallas_call(kernel: Callable[..., None], *, out_shape: Any, **kwargs: Any
                ) -> Callable[..., Any]:
    """`pl.pallas_call(kernel, out_shape=out_shape, **kwargs)`, with the out shapes typed by
    the inputs' varying mesh axes when called inside `jax.shard_map`."""

    def call(*args: Any) -> Any:
        shapes = out_shape
        if jax.sharding.get_abstract_mesh().manual_axes:
            varying = frozenset().union(*(jax.typeof(x).manual_axis_type.varying
                                          for x in jax.tree.leaves(args)))
            axis_type = jax.sharding.ManualAxisType(varying=varying)
            shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(
                s.shape, s.dtype, manual_axis_type=axis_type), out_shape)
        return pl.pallas_call(kernel, out_shape=shapes, **kwargs)(*args)

    return call
