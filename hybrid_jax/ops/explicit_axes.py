"""Ops under a mesh with explicit axes (`jax.make_mesh`'s default), on automatic ones.

Under explicit axes every operation's output sharding is part of its type, and JAX refuses
what it cannot type (a select whose predicate is split differently from its cases, a product
of operands split on different axes, a zero initial state against split inputs). The ops are
written for automatic axes, where XLA's propagation lays out what they do not constrain; so
each public op runs inside `jax.sharding.auto_axes` over the explicit axes when there are any
(`typed_like_inputs`), and is the plain call otherwise: on an automatic mesh, without one, or
inside a `shard_map` manual over every axis (a model's mixers, called from a model that is
already on automatic axes, take the plain call too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
from jax.sharding import PartitionSpec

F = TypeVar("F", bound=Callable[..., Any])


def explicit_axes() -> tuple[str, ...]:
    """The current mesh's explicit axes (none without a mesh or on automatic axes)."""
    return tuple(jax.sharding.get_abstract_mesh().explicit_axes)


def type_spec(x: jax.Array) -> PartitionSpec:
    """The PartitionSpec in `x`'s type: how a mesh with explicit axes splits it (all `None`
    where the mesh's axes are automatic or there is no mesh)."""
    return jax.typeof(x).sharding.spec


def on_automatic_axes(fn: Callable[..., Any], out_specs: Any, *args: Any) -> Any:
    """`fn(*args)`, its arrays on automatic mesh axes whatever the caller's mesh.

    The library lays activations out by logical name (`hybrid_jax.sharding.constrain`) and
    leaves the rest to XLA's sharding propagation: that needs automatic axes. Under a mesh
    with explicit axes the call runs inside `jax.sharding.auto_axes`: `args` (every array `fn`
    reads: a closed-over explicit array cannot enter) are resharded onto the automatic axes
    and the outputs come back typed by `out_specs` (PartitionSpecs, a pytree prefix of the
    outputs). Elsewhere (automatic axes, no mesh, inside a `shard_map` manual
    over every axis) it is `fn(*args)`."""
    axes = explicit_axes()
    if not axes:
        return fn(*args)
    # Those axes only: inside a shard_map the manual ones stay manual.
    return jax.sharding.auto_axes(fn, axes=axes, out_sharding=out_specs)(*args)


def typed_like_inputs(op: F) -> F:
    """`op` on automatic axes under explicit ones (`on_automatic_axes`), each output typed as
    the first array argument of its shape, else split along its first axis as the first
    array argument is when their first sizes agree (the batch: a final state, a step's
    output), else replicated. Non-array arguments (sizes, flags, `implementation=`) stay
    Python values."""

    @functools.wraps(op)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not explicit_axes():
            return op(*args, **kwargs)
        leaves, treedef = jax.tree.flatten((args, kwargs))
        is_array = [isinstance(leaf, jax.Array) for leaf in leaves]
        arrays = [leaf for leaf, array in zip(leaves, is_array, strict=True) if array]

        def on_arrays(*arrays: jax.Array) -> Any:
            given = iter(arrays)
            args, kwargs = treedef.unflatten([next(given) if array else leaf for leaf, array
                                              in zip(leaves, is_array, strict=True)])
            return op(*args, **kwargs)

        # The outputs' shapes, to type them before the call (traced on automatic axes).
        shapes = jax.eval_shape(lambda *a: on_automatic_axes(on_arrays, PartitionSpec(), *a),
                                *arrays)
        specs = jax.tree.map(lambda out: _spec_like(out.shape, arrays), shapes)
        return on_automatic_axes(on_arrays, specs, *arrays)

    return call  # type: ignore[return-value]


def _spec_like(shape: tuple[int, ...], arrays: list[jax.Array]) -> PartitionSpec:
    for x in arrays:
        if x.shape == shape:
            return type_spec(x)
    if shape and arrays and arrays[0].ndim and arrays[0].shape[0] == shape[0]:
        rows = (*type_spec(arrays[0]), None)[0]  # (a spec may leave trailing axes out)
        return PartitionSpec(rows, *[None] * (len(shape) - 1))
    return PartitionSpec(*[None] * len(shape))
