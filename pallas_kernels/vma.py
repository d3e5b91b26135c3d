"""Manual mesh axes inside `jax.shard_map`: what a value varies over, and making values agree.

Under `shard_map`'s type check (`check_vma`, its default) every value records the manual mesh
axes it varies over. A loop's carry must enter varying as it leaves (a zero or replicated
initial state that per-device inputs update), a custom VJP's cotangent must vary as its primal
does, and a `pallas_call`'s outputs must state theirs. Outside `shard_map` nothing varies and
these are the identity. Shared by the kernels and by `hybrid_jax`'s ops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax


def varying_axes(*trees: Any) -> frozenset:
    """The manual mesh axes any array of `trees` varies over (none outside `shard_map`)."""
    axes: frozenset = frozenset()
    for x in jax.tree.leaves(trees):
        mat = getattr(jax.typeof(x), "manual_axis_type", None) if isinstance(x, jax.Array) else None
        axes |= frozenset() if mat is None else mat.varying
    return axes


def varying_over(x: jax.Array, axes: Iterable[str]) -> jax.Array:
    """`x` marked as varying over `axes` (those of them it does not vary over yet)."""
    missing = tuple(sorted(set(axes) - varying_axes(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def varying_like(tree: Any, *like: Any) -> Any:
    """`tree` marked as varying over every manual mesh axis that the arrays of `like` vary
    over: a loop's initial state before per-device inputs update it, or a weight shared by
    every shard before it enters a kernel's custom VJP with a sharded input (its cotangent
    varies like that input, and the VJP's types must match)."""
    axes = varying_axes(like)
    return jax.tree.map(lambda x: varying_over(x, axes), tree) if axes else tree


def cotangent_for(cotangent: jax.Array, primal: jax.Array) -> jax.Array:
    """A custom VJP's `cotangent` of `primal`, summed over the manual axes it varies over and
    `primal` does not (a replicated weight used on each device's rows): what autodiff's
    transpose of the implicit broadcast does, and what `custom_vjp` requires."""
    extra = tuple(sorted(varying_axes(cotangent) - varying_axes(primal)))
    return jax.lax.psum(cotangent, extra) if extra else cotangent
