"""What every module of a model shares: dtypes, init scales, the RMSNorm of its width and the
skipped-branch `unless`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.config import ModelConfig
from hybrid_jax.nn import diagnostics
from hybrid_jax.nn.layers import RMSNorm
from hybrid_jax.sharding import explicit_axes, on_automatic_axes
from pallas_kernels import vma


def compute_dtype(config: ModelConfig):
    return jnp.dtype(config.dtype)


def param_dtype(config: ModelConfig):
    return jnp.dtype(config.param_dtype)


def output_std(config: ModelConfig) -> float:
    """Init std of projections writing into the residual stream: std / √(2·num_layers) (GPT-2)."""
    return config.init_std / math.sqrt(2 * len(config.layers))


def dense_kwargs(config: ModelConfig, rngs: nnx.Rngs) -> dict[str, Any]:
    """The keyword arguments every `Linear` of a model shares."""
    return dict(rngs=rngs, std=config.init_std, dtype=compute_dtype(config),
                param_dtype=param_dtype(config))


def run_on_automatic_axes(module: nnx.Module, method: Callable[..., Any],
                          out_specs: Callable[[], Any], *args: Any) -> Any:
    """`method(module, *args)` on automatic mesh axes (`sharding.on_automatic_axes`, outputs
    typed `out_specs()`): under a mesh with explicit axes the module's state travels as an
    argument (an explicitly typed parameter cannot be closed over); elsewhere the plain call."""
    axes = explicit_axes()
    if not axes:
        return method(module, *args)
    if diagnostics.recording():  # the reports would land on the copy made below
        raise ValueError(f"diagnostics.recorded runs the model on automatic mesh axes only; "
                         f"the current mesh has explicit axes {axes} (make it "
                         "with hybrid_jax.sharding.make_mesh, as the trainer does)")
    graphdef, state = nnx.split(module)
    return on_automatic_axes(lambda state, *args: method(nnx.merge(graphdef, state), *args),
                             out_specs(), state, *args)


def norm(config: ModelConfig, dim: int | None = None) -> RMSNorm:
    return RMSNorm(config.d_model if dim is None else dim, eps=config.norm_eps,
                   dtype=compute_dtype(config), param_dtype=param_dtype(config))


def shared_or_new(shared: dict[str, nnx.Module] | None, name: str, build) -> nnx.Module:
    """`shared[name]` when a block passes that part in (parameters shared between mixers), else
    `build()`: how a mixer takes projections owned by another mixer (Oryx's shared W_K, W_V)."""
    if shared and name in shared:
        return shared[name]
    return build()


def unless(skip: jax.Array, fn, *args) -> jax.Array:
    """`fn(*args)`, or zeros of its shape without evaluating it when the bool `skip` is True
    (Oryx's mixer not in use for a call). The zeros vary over a caller's `shard_map` axes as
    the arguments do, so both branches have one type there."""
    shape = jax.eval_shape(fn, *args)
    zeros = lambda *_: vma.varying_like(jnp.zeros(shape.shape, shape.dtype), args)  # noqa: E731
    return jax.lax.cond(skip, zeros, fn, *args)
