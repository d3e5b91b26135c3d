"""Every parameter of every preset has a PartitionSpec from the rules table, and on an FSDP ×
tensor mesh no large parameter is left replicated (an unnamed or indivisible axis would
silently copy it onto every device)."""

import jax
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import MeshConfig
from hybrid_jax.sharding import make_mesh, state_shardings

LARGE = 1 << 16  # elements; smaller parameters (norm scales, biases, gates) may replicate


def parameter_specs(config, mesh) -> dict[str, tuple[tuple[int, ...], jax.sharding.PartitionSpec]]:
    """`path: (shape, spec)` of every parameter, without allocating the model."""
    abstract = nnx.eval_shape(lambda: hj.create_model(config, seed=0))
    state = nnx.state(abstract, nnx.Param)
    shardings = state_shardings(state, mesh)
    specs = {}
    for (path, variable), (_, sharded) in zip(
            nnx.to_flat_state(state), nnx.to_flat_state(shardings), strict=True):
        specs["/".join(map(str, path))] = (variable.get_value().shape,
                                           sharded.get_value().spec)
    return specs


@pytest.mark.parametrize("name", [n for n in presets.names() if "tiny" not in n])
def test_no_large_parameter_is_replicated(name):
    config = presets.get(name)
    if not config.scan_layers:  # each distinct layer once: the rules see every parameter kind
        config = config.replace(layers=tuple(dict.fromkeys(config.layers)))
    specs = parameter_specs(config, make_mesh(MeshConfig(data=1, fsdp=4, tensor=2)))
    replicated = {path: shape for path, (shape, spec) in specs.items()
                  if np.prod(shape) >= LARGE and all(axis is None for axis in spec)}
    listing = "\n".join(f"{path} {shape} {spec}" for path, (shape, spec) in specs.items())
    assert not replicated, f"large replicated parameters {replicated}; all specs:\n{listing}"
    # Both axes are used: FSDP shards the embedding dimension, tensor splits heads / MLP units.
    used = {axis for _, spec in specs.values() for axis in jax.tree.leaves(tuple(spec))}
    assert {"fsdp", "tensor"} <= used, listing
