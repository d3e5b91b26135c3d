"""Grouped-query softmax attention with RoPE, optional sliding window and cosine attention."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import ops
from hybrid_jax.cache import AttentionCache
from hybrid_jax.config import ModelConfig
from hybrid_jax.nn.blocks import compute_dtype, dense_kwargs, mixer_block_builder, output_std
from hybrid_jax.nn.layers import Linear, RoPE
from hybrid_jax.ops import context_parallel
from hybrid_jax.registry import register_block
from hybrid_jax.sharding import constrain


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """Options of an attention layer; unset ones take the ModelConfig field of the same name."""

    num_heads: int = 4
    num_kv_heads: int | None = None
    head_dim: int | None = None
    window: int | None = None  # None: full causal; w: keys t−w+1..t
    rope_theta: float = 10000.0
    rope_fraction: float = 1.0  # share of each head's channels that RoPE rotates
    cosine: bool = False  # scaled-cosine attention with a learnable per-head temperature
    implementation: str | None = None  # see hybrid_jax.ops.attention

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window={self.window}: attention needs window >= 1 or None")
        ops.rotary_dim(8, self.rope_fraction)  # validates the fraction

    def check(self, model: ModelConfig) -> None:
        heads, kv = self.num_heads, self.num_kv_heads or self.num_heads
        if heads % kv:
            raise ValueError(f"num_kv_heads={kv} does not divide num_heads={heads}")
        if self.head_dim is None and model.d_model % heads:
            raise ValueError(f"num_heads={heads} does not divide d_model={model.d_model}")


class AttentionMixer(nnx.Module):
    """Causal multi-head / grouped-query attention.

    Decoding keeps an `AttentionCache`: `window` entries (a ring buffer) when windowed, else
    `max_len`.
    """

    def __init__(self, config: ModelConfig, options: AttentionOptions, *, rngs: nnx.Rngs):
        self.num_heads = options.num_heads
        self.num_kv_heads = options.num_kv_heads or options.num_heads
        self.head_dim = options.head_dim or config.d_model // options.num_heads
        self.window, self.cosine = options.window, options.cosine
        self.implementation = options.implementation
        self.dtype = compute_dtype(config)
        d, h, kv, hd = config.d_model, self.num_heads, self.num_kv_heads, self.head_dim
        kw = dense_kwargs(config, rngs)
        self.q_proj = Linear(d, (h, hd), axes=("embed", "heads", "head_dim"), **kw)
        self.k_proj = Linear(d, (kv, hd), axes=("embed", "kv_heads", "head_dim"), **kw)
        self.v_proj = Linear(d, (kv, hd), axes=("embed", "kv_heads", "head_dim"), **kw)
        self.o_proj = Linear((h, hd), d, axes=("heads", "head_dim", "embed"),
                             **{**kw, "std": output_std(config)})
        self.rope = RoPE(theta=options.rope_theta, fraction=options.rope_fraction)
        if options.cosine:
            self.log_temperature = nnx.Param(jnp.full((h,), math.log(10.0), jnp.float32),
                                             logical_axes=("heads",))

    def _project(self, x_BTD: jax.Array, positions_BT: jax.Array):
        q = constrain(self.rope(self.q_proj(x_BTD), positions_BT),
                      ("batch", "seq", "heads", "head_dim"))
        k = constrain(self.rope(self.k_proj(x_BTD), positions_BT),
                      ("batch", "seq", "kv_heads", "head_dim"))
        v = constrain(self.v_proj(x_BTD), ("batch", "seq", "kv_heads", "head_dim"))
        return q, k, v

    def _attend(self, q, k, v, **kwargs) -> jax.Array:
        kwargs.update(causal=True, window=self.window, implementation=self.implementation)
        if self.cosine:
            out = ops.scaled_cosine_attention(q, k, v, self.log_temperature[...],
                                              attend=context_parallel.attention, **kwargs)
        else:
            out = context_parallel.attention(q, k, v, **kwargs)
        return self.o_proj(constrain(out, ("batch", "seq", "heads", "head_dim")))

    def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array,
                 segment_ids_BT: jax.Array | None = None) -> jax.Array:
        q, k, v = self._project(x_BTD, positions_BT)
        return self._attend(q, k, v, segment_ids=segment_ids_BT)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> AttentionCache:
        length = max_len if self.window is None else min(self.window, max_len)
        shape = (batch, length, self.num_kv_heads, self.head_dim)
        return AttentionCache(keys=jnp.zeros(shape, dtype), values=jnp.zeros(shape, dtype),
                              positions=jnp.full((length,), -1, jnp.int32))

    def decode(self, x_BTD: jax.Array, cache: AttentionCache, *, positions_BT: jax.Array
               ) -> tuple[jax.Array, AttentionCache]:
        """Attends new tokens to the cached ones and to each other, then stores the newest."""
        q, k, v = self._project(x_BTD, positions_BT)
        new_positions = positions_BT[0].astype(jnp.int32)  # positions are shared by the batch
        keys = jnp.concatenate([cache.keys, k.astype(cache.keys.dtype)], axis=1)
        values = jnp.concatenate([cache.values, v.astype(cache.values.dtype)], axis=1)
        key_positions = jnp.concatenate([cache.positions, new_positions])
        out = self._attend(q, keys.astype(q.dtype), values.astype(q.dtype),
                           q_positions=new_positions, kv_positions=key_positions)
        return out, _store(cache, k, v, new_positions)


def _store(cache: AttentionCache, k: jax.Array, v: jax.Array, positions: jax.Array
           ) -> AttentionCache:
    """Writes the newest min(T, L) entries into their ring slots `position % L`."""
    length = cache.positions.shape[0]
    keep = min(k.shape[1], length)
    k, v, positions = k[:, -keep:], v[:, -keep:], positions[-keep:]
    slots = positions % length
    return AttentionCache(
        keys=cache.keys.at[:, slots].set(k.astype(cache.keys.dtype)),
        values=cache.values.at[:, slots].set(v.astype(cache.values.dtype)),
        positions=cache.positions.at[slots].set(positions),
    )


register_block("attention", AttentionOptions,
               "pre-norm GQA softmax attention (RoPE, optional window / cosine) + SwiGLU")(
    mixer_block_builder(AttentionMixer))
