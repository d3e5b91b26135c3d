"""Pallas kernels under a mesh: every device runs the kernel on its own batch rows and heads
(and, for row-wise kernels, its own tokens).

To XLA a Pallas kernel is one custom call that its SPMD partitioner cannot split: under a mesh
that shards the batch (`data`, `fsdp`) or the heads (`tensor`) it would gather the inputs and
run the whole call on every device. `shard_kernel` runs the call inside `jax.shard_map` over
the current mesh instead: the batch axis split over the batch mesh axes and the head axis over
the head mesh axis, as `hybrid_jax.sharding.LOGICAL_AXIS_RULES` lays out activations ("batch",
"heads", "kv_heads"). Every row and head of these recurrences and attentions is independent of
the others, so each shard's call is the op on that shard.

Layouts name each dimension of an input or output by a letter, as the ops' docstrings do:
`B` batch, `H` heads and `G` groups of heads (GQA's kv heads, SSD's B/C groups), `S` a time
axis whose positions are independent rows (a norm's tokens, the loss's), split over the `seq`
mesh axis as activations are ("seq"); any other letter (`T`, a recurrence's time) not split.
`H` and `G` split together or not at all: head h reads group h // (H/G), so contiguous blocks
of H/D heads and G/D groups stay matched when D divides both. A single group (G = 1) that no
output carries stays whole on every device while the heads split. A per-head input (SSD's
`A`, layout "H") splits with the heads.

Not split here: the time of a recurrence or attention (`T`: context parallelism,
`hybrid_jax.ops.context_parallel`, splits it and calls the ops on each time shard inside its
own `shard_map`), and any mesh axis that an enclosing `shard_map` already made manual.
Row-wise kernels outside it (the norms, the loss's statistics) name their time `S`: kept
whole, it would be all-gathered over `seq` and every device would run the whole sequence.
Where the batch, the heads or such a sequence do not divide their axes, those stay whole on
every device (replicated work), logged once per shapes on the dispatcher's logger.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from hybrid_jax.ops.dispatch import log_once
from pallas_kernels.vma import varying_over

BATCH_AXES = ("data", "fsdp")
HEAD_AXIS = "tensor"
SEQ_AXIS = "seq"
SPLIT = {"B": "batch", "H": "heads", "G": "groups", "S": "sequence"}


def shard_kernel(op: str, kernel: Callable[..., Any], args: Sequence[Any],
                 layouts: Sequence[Any], out_layouts: Any, *, check_vma: bool = True) -> Any:
    """`kernel(*args)`, each device computing its batch and head shard (and, for row-wise
    kernels, its sequence shard) under the current mesh.

    Args:
      op: the op's name (errors and logs).
      kernel: the per-shard call; it sees the shard's arrays, and must return the same
        structure and dimension letters for any batch and head count.
      args: its positional arguments, pytrees of arrays or None.
      layouts: per argument, one layout string for all its leaves or a pytree of them matching
        it (ignored where the argument is None).
      out_layouts: layout strings, a pytree prefix of the kernel's output.
      check_vma: the shard_map's varying-axes check; False only for a kernel that cannot state
        them (JAX's splash attention: its `pallas_call`s give plain out shapes, which the check
        refuses). Without it the transpose sums the gradients of inputs whole over a split
        axis as well (shard_map's untyped rule).

    Without a mesh, or where no batch, head or (with `S`) sequence axis of size > 1 is left to
    split, simply `kernel(*args)`.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return kernel(*args)
    leaves, treedef = jax.tree.flatten(tuple(args))
    leaf_layouts = [layout for arg, layout in zip(args, layouts, strict=True) if arg is not None
                    for layout in _leaf_layouts(op, arg, layout)]
    sizes = _sizes(op, leaves, leaf_layouts)
    free = [a for a in mesh.axis_names if a not in mesh.manual_axes and mesh.shape[a] > 1]
    batch_axes = tuple(a for a in BATCH_AXES if a in free and sizes["B"])
    head_axis = HEAD_AXIS if HEAD_AXIS in free else None
    seq_axis = SEQ_AXIS if SEQ_AXIS in free and sizes["S"] else None
    reasons = []
    batch_devices = math.prod(mesh.shape[a] for a in batch_axes)
    if batch_axes and any(n % batch_devices for n in sizes["B"]):
        reasons.append(f"batch {sorted(sizes['B'])} is not a multiple of the {batch_devices} "
                       f"devices of mesh axes {batch_axes}")
        batch_axes = ()
    # One group that no output carries (MQA, Mamba-2's single B/C group): every device keeps
    # it whole and splits the heads.
    one_group = sizes["G"] == {1} and not any("G" in o for o in jax.tree.leaves(out_layouts))
    split = sizes["H"] | (set() if one_group else sizes["G"])
    if head_axis and any(n % mesh.shape[head_axis] for n in split):
        heads = ", ".join(f"{SPLIT[c]} {n}" for c in "HG" for n in sizes[c])
        reasons.append(f"{heads} do not split over the {mesh.shape[head_axis]} devices of mesh "
                       f"axis {head_axis!r}")
        head_axis = None
    group_axis = None if one_group else head_axis
    if seq_axis and any(n % mesh.shape[seq_axis] for n in sizes["S"]):
        reasons.append(f"sequence {sorted(sizes['S'])} is not a multiple of the "
                       f"{mesh.shape[seq_axis]} devices of mesh axis {seq_axis!r}")
        seq_axis = None
    if reasons:
        shapes = tuple((tuple(x.shape), str(x.dtype)) for x in leaves)
        log_once((op, "shard_kernel", shapes, tuple(reasons)), logging.WARNING,
                 "%s: the Pallas kernel runs whole on every device for what does not split: %s "
                 "(input shapes %s)", op, "; ".join(reasons), [s for s, _ in shapes])
    manual = set(batch_axes) | {a for a in (head_axis, seq_axis) if a}
    if not manual:
        return kernel(*args)

    def spec(layout: str) -> P:
        batch = batch_axes[0] if len(batch_axes) == 1 else batch_axes
        axes = {"B": batch, "H": head_axis, "G": group_axis, "S": seq_axis}
        return P(*(axes.get(c) for c in layout))

    def per_shard(*shard_leaves):
        # An input whole over a manual axis (one group, SSD's A over the batch) varies from
        # here on: its gradient from the kernel's VJP is then summed over that axis.
        if check_vma:
            shard_leaves = [varying_over(x, manual) for x in shard_leaves]
        return kernel(*jax.tree.unflatten(treedef, shard_leaves))

    return jax.shard_map(per_shard, in_specs=tuple(spec(layout) for layout in leaf_layouts),
                         out_specs=jax.tree.map(spec, out_layouts), axis_names=manual,
                         check_vma=check_vma)(*leaves)


def row_layout(ndim: int) -> str:
    """The layout of `ndim` leading axes of independent rows (`[B, T, ...]`): batch, the
    sequence split as rows (`S`), any further axes whole."""
    return "BS"[:ndim] + "T" * max(ndim - 2, 0)


def _leaf_layouts(op: str, arg: Any, layout: Any) -> list[str]:
    """The layout of every leaf of `arg`: `layout` broadcast over its subtrees."""
    return jax.tree.leaves(jax.tree.map(lambda each, sub: jax.tree.map(lambda _: each, sub),
                                        layout, arg))


def _sizes(op: str, leaves: list[jax.Array], layouts: list[str]) -> dict[str, set[int]]:
    """The sizes of the split dimensions (`B`, `H`, `G`, `S`) over all inputs."""
    sizes: dict[str, set[int]] = {letter: set() for letter in SPLIT}
    for x, layout in zip(leaves, layouts, strict=True):
        if len(layout) != x.ndim:
            raise ValueError(f"{op}: layout {layout!r} names {len(layout)} dimensions of an "
                             f"input of shape {x.shape}")
        for letter, n in zip(layout, x.shape, strict=True):
            if letter in sizes:
                sizes[letter].add(n)
    for letter, found in sizes.items():
        if len(found) > 1:
            raise ValueError(f"{op}: the inputs disagree on their {SPLIT[letter]} ({letter}): "
                             f"{sorted(found)}")
    return sizes
