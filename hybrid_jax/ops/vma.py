"""Loop carries inside a caller's `jax.shard_map`: varying per device as the inputs are.

Under `jax.shard_map` (with `check_vma`, its default) every value records the manual mesh
axes it varies over, and `lax.scan` refuses a carry that enters unvarying and leaves varying:
a zero (or replicated) initial state that the body updates from per-device tokens. The ops'
scans start from `like(initial_state, *inputs)`, so a model runs inside a data-parallel
shard_map as it runs under `jit`. Outside a shard_map nothing varies and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax


def varying_over(x: jax.Array, axes: Iterable[str]) -> jax.Array:
    """`x` marked as varying over `axes` (those of them it does not vary over yet)."""
    missing = tuple(sorted(set(axes) - _varying_axes(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def like(tree: Any, *inputs: Any) -> Any:
    """`tree`'s arrays varying over every manual mesh axis that an array of `inputs` (pytrees,
    None allowed) varies over."""
    axes = set().union(*(_varying_axes(x) for x in jax.tree.leaves(inputs)))
    return jax.tree.map(lambda x: varying_over(x, axes), tree) if axes else tree


def _varying_axes(x: jax.Array) -> frozenset[str]:
    return jax.typeof(x).manual_axis_type.varying


def cotangent_for(cotangent: jax.Array, primal: jax.Array) -> jax.Array:
    """A custom VJP's `cotangent` of `primal`, summed over the manual axes it varies over and
    `primal` does not (a replicated weight used on each device's rows): what autodiff's
    transpose of the implicit broadcast does, and what `custom_vjp` requires."""
    extra = tuple(sorted(_varying_axes(cotangent) - _varying_axes(primal)))
    return jax.lax.psum(cotangent, extra) if extra else cotangent
