"""Meshes and the one table that maps logical axis names to mesh axes.

Every parameter carries `logical_axes` metadata (one name per dimension, e.g. `("embed",
"mlp")`) and the main activations are constrained with `constrain(x, ("batch", "seq",
"embed"))`. `LOGICAL_AXIS_RULES` maps names to mesh axes once; changing a parallelism strategy
means changing that table (or passing another), never the model code.

Mesh axes: `data` (pure data parallelism: parameters replicated), `fsdp` (data parallel with
parameters and optimizer state sharded along `embed`), `tensor` (Megatron-style: heads and MLP
hidden units split), `seq` (context parallelism: the time axis of activations split; the
mixers run their context-parallel forms, `hybrid_jax.ops.context_parallel`). A dimension that
its mesh axis does not divide stays replicated.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hybrid_jax.config import MeshConfig
from hybrid_jax.ops.explicit_axes import (  # noqa: F401 (re-exported: this module's API)
    explicit_axes,
    on_automatic_axes,
    type_spec,
)
from hybrid_jax.registry import Registry

MESH_AXES = ("data", "fsdp", "seq", "tensor")

MeshAxes = str | tuple[str, ...] | None

LOGICAL_AXIS_RULES: Mapping[str, MeshAxes] = {
    "batch": ("data", "fsdp"),
    "seq": "seq",
    "embed": "fsdp",
    "vocab": "tensor",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "state": None,
    "slots": None,
    "conv": None,
    "norm": None,
    "layers": None,
}


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def validate_rules(rules: Mapping[str, MeshAxes]) -> None:
    for name, axes in rules.items():
        for axis in _as_tuple(axes):
            if axis not in MESH_AXES:
                raise ValueError(f"logical axis rule {name!r} -> {axes!r}: mesh axis {axis!r} is "
                                 f"not one of {MESH_AXES}")
        if len(set(_as_tuple(axes))) < len(_as_tuple(axes)):  # JAX refuses it in every spec
            raise ValueError(f"logical axis rule {name!r} -> {axes!r}: names a mesh axis twice")


validate_rules(LOGICAL_AXIS_RULES)

AXIS_RULE_SETS = Registry("axis rule set")
AXIS_RULE_SETS.register("default", LOGICAL_AXIS_RULES,
                        "batch over data+fsdp, embed over fsdp, heads/mlp/vocab over tensor")
AXIS_RULE_SETS.register("replicated", {**{name: None for name in LOGICAL_AXIS_RULES},
                                       "batch": ("data", "fsdp")},
                        "pure data parallelism: every parameter replicated")

_active = threading.local()


def axis_rules(config: MeshConfig) -> Mapping[str, MeshAxes]:
    """The rule table `config` chooses: a named set with single-rule overrides, validated."""
    rules = dict(AXIS_RULE_SETS.get(config.axis_rules))
    for override in config.axis_rule_overrides:
        name, sep, axes = override.partition("=")
        if not sep or name.strip() not in rules:
            raise ValueError(f"MeshConfig.axis_rule_overrides: {override!r} must be "
                             f"'logical=axis[+axis]' or 'logical=none' with logical one of "
                             f"{sorted(rules)}")
        parts = tuple(a.strip() for a in axes.split("+") if a.strip())
        rules[name.strip()] = None if parts in ((), ("none",)) else (
            parts[0] if len(parts) == 1 else parts)
    validate_rules(rules)
    return rules


def current_rules() -> Mapping[str, MeshAxes]:
    return getattr(_active, "rules", LOGICAL_AXIS_RULES)


@contextlib.contextmanager
def use_rules(rules: Mapping[str, MeshAxes]) -> Iterator[None]:
    """Makes `rules` the table of `constrain`, `state_shardings` and `batch_sharding` (at trace
    time) within the context."""
    previous = current_rules()
    _active.rules = rules
    try:
        yield
    finally:
        _active.rules = previous


def make_mesh(config: MeshConfig | None = None, devices: Sequence | None = None) -> Mesh:
    """A `(data, fsdp, seq, tensor)` mesh over `devices` (default: all), sizes from `config`.

    A mesh over the first `prod(shape)` of them: in a job of several processes that would leave
    some processes without a device, so there the default mesh must take every device."""
    given = devices is not None
    devices = list(jax.devices() if devices is None else devices)
    shape = (config or MeshConfig()).shape(len(devices))
    used = int(np.prod(shape))
    if not given and used < len(devices) and jax.process_count() > 1:
        sizes = dict(zip(MESH_AXES, shape, strict=True))
        raise ValueError(
            f"a job of {jax.process_count()} processes trains on all {len(devices)} devices "
            f"(each process feeds its own), but the mesh {sizes} takes {used}: choose "
            f"train.mesh sizes whose product is {len(devices)} (-1 takes the rest)")
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices[:used])


def logical_to_spec(
    logical_axes: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    rules: Mapping[str, MeshAxes] | None = None,
) -> PartitionSpec:
    """PartitionSpec for named dimensions; with `shape` and `mesh`, indivisible dims replicate,
    and so do the axes that an enclosing `shard_map` made manual (each device holds its shard
    there already) and those the mesh lacks (a caller's own mesh, e.g. `data` alone). `rules`
    default to the active table (`use_rules`)."""
    rules = current_rules() if rules is None else rules
    spec, used = [], set()
    for dim, name in enumerate(logical_axes):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        axes = tuple(a for a in _as_tuple(rules[name]) if a not in used)
        if mesh is not None:
            manual = getattr(mesh, "manual_axes", ())
            axes = tuple(a for a in axes if mesh.shape.get(a, 1) > 1 and a not in manual)
            if shape is not None and shape[dim] % int(np.prod([mesh.shape[a] for a in axes])):
                axes = ()
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else (axes or None))
    return PartitionSpec(*spec)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical names under the current mesh; a no-op without one
    or inside a `shard_map` manual over all its axes."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or set(mesh.axis_names) <= set(mesh.manual_axes):
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, mesh))


def variable_sharding(variable: nnx.Variable, mesh: Mesh) -> NamedSharding:
    axes = variable.get_metadata().get("logical_axes")
    value = variable.get_value()
    if axes is None:
        axes = (None,) * np.ndim(value)
    if len(axes) != np.ndim(value):
        raise ValueError(f"logical_axes {axes} do not match the shape {np.shape(value)} of a "
                         f"{type(variable).__name__}")
    return NamedSharding(mesh, logical_to_spec(axes, np.shape(value), mesh))


def state_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """The NamedSharding of every variable in an (abstract) NNX state, from its logical axes."""
    return jax.tree.map(
        lambda v: v.replace(variable_sharding(v, mesh)) if isinstance(v, nnx.Variable) else v,
        state,
        is_leaf=lambda v: isinstance(v, nnx.Variable),
    )


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a `[batch, ...]` input array: batch over the data-parallel axes."""
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1)))


def check_batch_split(mesh: Mesh, batch_size: int, what: str = "train.batch_size") -> None:
    """Refuses a global batch that the mesh's batch axes (`batch_sharding`) do not split into
    equal shards; JAX's own error names a NamedSharding and a tiling, not the setting."""
    axes = batch_sharding(mesh).spec[0]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    shards = math.prod(mesh.shape[a] for a in axes)
    if batch_size % shards:
        sizes = " x ".join(f"{a} {mesh.shape[a]}" for a in axes)
        raise ValueError(f"{what}={batch_size} does not split over the mesh's batch axes "
                         f"({sizes} = {shards} shards): use a multiple of {shards}, or fewer "
                         "data / fsdp devices")


def check_seq_split(mesh: Mesh, seq_len: int, what: str = "data.seq_len") -> None:
    """Refuses a sequence that the mesh's `seq` axis does not split into equal time shards;
    the context-parallel ops' own error comes once the model is traced and names an
    activation's shape, not the setting."""
    shards = mesh.shape["seq"]
    if seq_len % shards:
        raise ValueError(f"{what}={seq_len} does not split over the mesh's {shards} 'seq' "
                         f"devices (context parallelism): use a multiple of {shards}, or "
                         "fewer seq devices")
