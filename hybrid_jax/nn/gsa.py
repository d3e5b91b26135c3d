"""Gated Slot Attention (Zhang et al., 2024): softmax attention over M gated memory slots.

Per token, with H heads of size K (queries, keys and values) and M slots per head:

    q, k = swish(W_q x), swish(W_k x),  v = silu(W_v x)             ([H, K] each)
    g = logsigmoid(W_f x) / τ,  s = 1 − e^g                           ([H, M]; τ = 8)
    K̃ ← K̃·diag(e^g) + k sᵀ,  Ṽ ← diag(e^g)·Ṽ + s vᵀ                  (K̃ [K, M], Ṽ [M, V])
    o = Ṽᵀ softmax(scale·K̃ᵀ q)                                       (scale 1 by default)
    out = W_o · RMSNorm(silu(o))                                     (norm over all heads)

as in fla's `GatedSlotAttention` layer with its defaults (no short convs, no output gate, no
biases, logit scale 1, `gate_logit_normalizer` τ = 8). The recurrence is
`hybrid_jax.ops.gated_slot_attention`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import GSACache
from hybrid_jax.config import ModelConfig
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, norm, output_std
from hybrid_jax.nn.layers import Linear
from hybrid_jax.ops import context_parallel
from hybrid_jax.ops.gsa import gated_slot_attention, gated_slot_attention_step
from hybrid_jax.sharding import constrain


@dataclasses.dataclass(frozen=True)
class GSAOptions:
    """Options of a GSA layer; `num_heads` and `head_dim` (None: d_model / num_heads) default
    to the ModelConfig fields of the same name."""

    num_heads: int = 4
    head_dim: int | None = None
    num_slots: int = 64  # M, per head
    gate_logit_normalizer: float = 8.0  # τ in g = logsigmoid(W_f x) / τ
    scale: float = 1.0  # slot-logit scale (fla's default; the op's own default is K^-1/2)
    chunk_size: int = 64  # of the chunked form, a power of two
    implementation: str | None = None  # of hybrid_jax.ops.gated_slot_attention

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_slots", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GSAOptions.{name}={value!r}: expected a positive integer")
        if self.chunk_size & (self.chunk_size - 1):
            raise ValueError(f"GSAOptions.chunk_size={self.chunk_size}: expected a power of two")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim < 1):
            raise ValueError(f"GSAOptions.head_dim={self.head_dim!r}: expected a positive "
                             "integer or None (d_model / num_heads)")
        for name in ("gate_logit_normalizer", "scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GSAOptions.{name}={getattr(self, name)!r}: expected a "
                                 "positive number")

    def check(self, model: ModelConfig) -> None:
        if self.head_dim is None and model.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide d_model="
                             f"{model.d_model} (set head_dim)")


def slot_attention_output(o_norm: nnx.Module, o_proj: nnx.Module, o_BTHK: jax.Array
                          ) -> jax.Array:
    """`W_o·RMSNorm(silu(o))` over the flattened heads: the output stage of GSA and NHA."""
    batch, T = o_BTHK.shape[:2]
    o = o_norm(jax.nn.silu(o_BTHK).reshape(batch, T, -1))
    return o_proj(o.reshape(o_BTHK.shape))


@register_mixer_block("gsa", GSAOptions, "Gated Slot Attention (M gated slots, softmax readout)")
class GSAMixer(nnx.Module):
    """The GSA mixer; decoding keeps a `GSACache` (slot keys and values, float32), so its
    memory does not grow with the sequence. Parts: `inputs(x)` (q, k, v, s, g), the op
    `gated_slot_attention`, `slot_attention_output`."""

    deepnorm_scaled = ("v_proj", "o_proj")

    def __init__(self, config: ModelConfig, options: GSAOptions, *, rngs: nnx.Rngs):
        options.check(config)
        self.num_heads = h = options.num_heads
        self.head_dim = k = options.head_dim or config.d_model // h
        self.num_slots = m = options.num_slots
        self.gate_logit_normalizer, self.scale = options.gate_logit_normalizer, options.scale
        self.chunk_size, self.implementation = options.chunk_size, options.implementation
        self.dtype = compute_dtype(config)
        d, kw = config.d_model, dense_kwargs(config, rngs)
        self.q_proj = Linear(d, (h, k), axes=("embed", "heads", "head_dim"), **kw)
        self.k_proj = Linear(d, (h, k), axes=("embed", "heads", "head_dim"), **kw)
        self.v_proj = Linear(d, (h, k), axes=("embed", "heads", "head_dim"), **kw)
        self.f_proj = Linear(d, (h, m), axes=("embed", "heads", "slots"), **kw)
        self.o_norm = norm(config, h * k)
        self.o_proj = Linear((h, k), d, axes=("heads", "head_dim", "embed"),
                             **{**kw, "std": output_std(config)})

    def inputs(self, x_BTD: jax.Array):
        """q, k, v `[B, T, H, K]` (feature maps applied) and s, g `[B, T, H, M]` float32."""
        names = ("batch", "seq", "heads", "head_dim")
        q, k, v = (constrain(jax.nn.silu(proj(x_BTD)), names)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        g = jax.nn.log_sigmoid(self.f_proj(x_BTD).astype(jnp.float32)) / self.gate_logit_normalizer
        return q, k, v, -jnp.expm1(g), g

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        q, k, v, s, g = self.inputs(x_BTD)
        o = context_parallel.gated_slot_attention(
            q, k, v, s, g, scale=self.scale, chunk_size=self.chunk_size,
            segment_ids=ctx.segment_ids, implementation=self.implementation)
        return slot_attention_output(self.o_norm, self.o_proj, o)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> GSACache:
        del max_len, dtype  # the slot state has a fixed size and stays float32
        h, k, m = self.num_heads, self.head_dim, self.num_slots
        return GSACache(slot_keys=jnp.zeros((batch, h, k, m), jnp.float32),
                        slot_values=jnp.zeros((batch, h, m, k), jnp.float32))

    def decode(self, x_BTD: jax.Array, cache: GSACache, ctx: TokenContext
               ) -> tuple[jax.Array, GSACache]:
        """Continues from `cache`: one token with the recurrence step, a prefill chunked."""
        del ctx
        q, k, v, s, g = self.inputs(x_BTD)
        state = (cache.slot_keys, cache.slot_values)
        if x_BTD.shape[1] == 1:
            o, state = gated_slot_attention_step(state, q[:, 0], k[:, 0], v[:, 0], s[:, 0],
                                                 g[:, 0], scale=self.scale)
            o = o[:, None]
        else:
            o, state = gated_slot_attention(q, k, v, s, g, scale=self.scale,
                                            initial_state=state, return_final_state=True,
                                            chunk_size=self.chunk_size,
                                            implementation=self.implementation)
        new_cache = GSACache(*(x.astype(jnp.float32) for x in state))
        return slot_attention_output(self.o_norm, self.o_proj, o), new_cache

