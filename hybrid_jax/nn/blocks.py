"""The standard residual block: pre-norm mixer, then pre-norm SwiGLU FFN.

Every mixer (attention, Mamba-2, Gated DeltaNet, ...) implements the `Mixer` protocol; wrapping
it in `MixerBlock` and registering a builder makes it a block type for `ModelConfig.layers`.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.config import ModelConfig
from hybrid_jax.nn.layers import RMSNorm, SwiGLU
from hybrid_jax.sharding import constrain


class Mixer(Protocol):
    """What a block needs from a sequence mixer; `x_BTD` in, `y_BTD` out."""

    def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
                 segment_ids_BT: jax.Array | None) -> jax.Array: ...

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> Any: ...

    def decode(self, x_BTD: jax.Array, cache: Any, *, positions_BT: jax.Array
               ) -> tuple[jax.Array, Any]: ...


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


def norm(config: ModelConfig, dim: int | None = None) -> RMSNorm:
    return RMSNorm(config.d_model if dim is None else dim, eps=config.norm_eps,
                   dtype=compute_dtype(config), param_dtype=param_dtype(config))


class MixerBlock(nnx.Module):
    """`x + mixer(norm(x))`, then `x + ffn(norm(x))` (no FFN sublayer when `ffn_dim == 0`)."""

    def __init__(self, config: ModelConfig, mixer: nnx.Module, *, rngs: nnx.Rngs):
        self.mixer_norm = norm(config)
        self.mixer = mixer
        hidden = config.resolved_ffn_dim
        self.ffn_norm = norm(config) if hidden else None
        self.ffn = SwiGLU(config.d_model, hidden, rngs=rngs, std=config.init_std,
                          out_std=output_std(config), dtype=compute_dtype(config),
                          param_dtype=param_dtype(config)) if hidden else None

    def _ffn(self, x: jax.Array) -> jax.Array:
        if self.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return constrain(x, ("batch", "seq", "embed"))

    def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
                 segment_ids_BT: jax.Array | None = None) -> jax.Array:
        mixed = self.mixer(self.mixer_norm(x_BTD), positions_BT=positions_BT,
                           segment_ids_BT=segment_ids_BT)
        return self._ffn(x_BTD + mixed)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> Any:
        return self.mixer.init_cache(batch, max_len, dtype)

    def decode(self, x_BTD: jax.Array, cache: Any, *, positions_BT: jax.Array
               ) -> tuple[jax.Array, Any]:
        mixed, cache = self.mixer.decode(self.mixer_norm(x_BTD), cache, positions_BT=positions_BT)
        return self._ffn(x_BTD + mixed), cache


def mixer_block_builder(mixer_cls: type):
    """A registry builder making `MixerBlock(config, mixer_cls(config, options, rngs=rngs))`."""

    def build(config: ModelConfig, options: Any, *, layer_index: int, rngs: nnx.Rngs):
        return MixerBlock(config, mixer_cls(config, options, rngs=rngs), rngs=rngs)

    build.__name__ = f"build_{mixer_cls.__name__}_block"
    return build
