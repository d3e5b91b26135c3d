"""Grouped-query softmax attention with RoPE, optional sliding window and cosine attention.

Parts: `project(x, ctx)` (q, k, v with RoPE at `ctx.positions`), `mix(q, k, v, ...)` (the op)
and `output(o)` (W_o); the projections `q_proj`, `k_proj`, `v_proj`, `o_proj` can be passed in
through `shared=` so that another mixer of the same block owns them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import ops
from hybrid_jax.cache import AttentionCache
from hybrid_jax.config import ModelConfig, check_rope_scaling, check_rope_theta
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, output_std, shared_or_new, unless
from hybrid_jax.nn.layers import Linear, RoPE
from hybrid_jax.ops import context_parallel
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
    rope_scaling: tuple[float, float, float, float] | None = None  # Llama-3 (see ops)
    qkv_bias: bool = False  # biases on q, k, v (Qwen2)
    cosine: bool = False  # scaled-cosine attention with a learnable per-head temperature
    temperature_init: float | None = None  # cosine's initial temperature; None: √head_dim
    # See hybrid_jax.ops.attention; cached decode steps run "xla" (no fast rung takes their
    # explicit positions), the fresh prefill this one.
    implementation: str | None = None

    def __post_init__(self) -> None:
        # 0 would read as unset (`or`) for the optional sizes and the temperature.
        for name, optional in (("num_heads", False), ("num_kv_heads", True),
                               ("head_dim", True)):
            value = getattr(self, name)
            if not (optional and value is None) and not value >= 1:
                raise ValueError(f"AttentionOptions.{name}={value!r}: expected a positive integer"
                                 + (" or None" if optional else ""))
        if self.temperature_init is not None and not self.temperature_init > 0:
            raise ValueError(f"AttentionOptions.temperature_init={self.temperature_init!r}: "
                             "expected a positive number or None (√head_dim)")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window={self.window}: attention needs window >= 1 or None")
        ops.rotary_dim(8, self.rope_fraction)  # validates the fraction
        check_rope_theta("AttentionOptions", self.rope_theta)
        if self.rope_scaling is not None:
            check_rope_scaling("AttentionOptions", self.rope_scaling)

    def check(self, model: ModelConfig) -> None:
        heads, kv = self.num_heads, self.num_kv_heads or self.num_heads
        if heads % kv:
            raise ValueError(f"num_kv_heads={kv} does not divide num_heads={heads}")
        if self.head_dim is None and model.d_model % heads:
            raise ValueError(f"num_heads={heads} does not divide d_model={model.d_model}")


@register_mixer_block("attention", AttentionOptions,
                      "GQA softmax attention (RoPE, optional window / cosine)")
class AttentionMixer(nnx.Module):
    """Causal multi-head / grouped-query attention.

    Decoding keeps an `AttentionCache`: `window` entries (a ring buffer) when windowed, else
    `max_len`. With `cosine`, queries and keys are L2-normalised and the logits scaled by a
    learnable per-head temperature `exp(log_temperature)`, initialised to √head_dim
    (`temperature_init`): cos(q, k) of random vectors has std 1/√head_dim, so training starts
    at ordinary attention's logit scale (std 1 for q·k/√head_dim).
    """

    deepnorm_scaled = ("v_proj", "o_proj")

    def __init__(self, config: ModelConfig, options: AttentionOptions, *, rngs: nnx.Rngs,
                 shared: dict[str, nnx.Module] | None = None):
        self.num_heads = options.num_heads
        self.num_kv_heads = options.num_kv_heads or options.num_heads
        self.head_dim = options.head_dim or config.d_model // options.num_heads
        self.window, self.cosine = options.window, options.cosine
        self.implementation = options.implementation
        self.dtype = compute_dtype(config)
        d, h, kv, hd = config.d_model, self.num_heads, self.num_kv_heads, self.head_dim
        kw = dense_kwargs(config, rngs)
        part = functools.partial(shared_or_new, shared)
        qkv = dict(kw, use_bias=options.qkv_bias)
        self.q_proj = part("q_proj", lambda: Linear(d, (h, hd), axes=("embed", "heads",
                                                                       "head_dim"), **qkv))
        self.k_proj = part("k_proj", lambda: Linear(d, (kv, hd), axes=("embed", "kv_heads",
                                                                        "head_dim"), **qkv))
        self.v_proj = part("v_proj", lambda: Linear(d, (kv, hd), axes=("embed", "kv_heads",
                                                                        "head_dim"), **qkv))
        self.o_proj = part("o_proj", lambda: Linear((h, hd), d, axes=("heads", "head_dim",
                                                                       "embed"),
                                                     **{**kw, "std": output_std(config)}))
        self.rope = RoPE(theta=options.rope_theta, fraction=options.rope_fraction,
                         scaling=options.rope_scaling)
        if options.cosine:
            init = options.temperature_init or math.sqrt(hd)
            self.log_temperature = nnx.Param(jnp.full((h,), math.log(init), jnp.float32),
                                             logical_axes=("heads",))

    def project(self, x_BTD: jax.Array, ctx: TokenContext):
        """q `[B,T,H,D]`, k, v `[B,T,Hkv,D]`; RoPE on q and k at `ctx.positions`."""
        positions_BT = ctx.positions
        q = constrain(self.rope(self.q_proj(x_BTD), positions_BT),
                      ("batch", "seq", "heads", "head_dim"))
        k = constrain(self.rope(self.k_proj(x_BTD), positions_BT),
                      ("batch", "seq", "kv_heads", "head_dim"))
        v = constrain(self.v_proj(x_BTD), ("batch", "seq", "kv_heads", "head_dim"))
        return q, k, v

    def mix(self, q, k, v, **kwargs) -> jax.Array:
        """The attention op (causal, this mixer's window and implementation unless given, and
        its temperature): `[B, T, H, D]`."""
        kwargs.setdefault("window", self.window)
        kwargs.setdefault("implementation", self.implementation)
        kwargs.update(causal=True)
        if self.cosine:
            out = ops.scaled_cosine_attention(q, k, v, self.log_temperature[...],
                                              attend=context_parallel.attention, **kwargs)
        else:
            out = context_parallel.attention(q, k, v, **kwargs)
        return constrain(out, ("batch", "seq", "heads", "head_dim"))

    def output(self, o_BTHD: jax.Array) -> jax.Array:
        return self.o_proj(o_BTHD)

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        q, k, v = self.project(x_BTD, ctx)
        return self.output(self.mix(q, k, v, segment_ids=ctx.segment_ids,
                                    segment_extents=ctx.segment_extents))

    def init_cache(self, batch: int, max_len: int, dtype: Any, *,
                   value_dim: int | None = None) -> AttentionCache:
        """Keys `[B, L, Hkv, D]` and values `[B, L, Hkv, value_dim]` (default D)."""
        length = max_len if self.window is None else min(self.window, max_len)
        shape = (batch, length, self.num_kv_heads, self.head_dim)
        values = (*shape[:3], value_dim or self.head_dim)
        return AttentionCache(keys=jnp.zeros(shape, dtype), values=jnp.zeros(values, dtype),
                              positions=jnp.full((length,), -1, jnp.int32))

    def decode(self, x_BTD: jax.Array, cache: AttentionCache, ctx: TokenContext
               ) -> tuple[jax.Array, AttentionCache]:
        """Attends new tokens to the cached ones and to each other, then stores the newest."""
        q, k, v = self.project(x_BTD, ctx)
        out, cache = self.attend_cached(q, k, v, cache, ctx.positions[0].astype(jnp.int32),
                                        fresh=ctx.fresh_cache)
        return self.output(out), cache

    def attend_cached(self, q, k, v, cache: AttentionCache, new_positions: jax.Array, *,
                      skip: jax.Array | None = None, fresh: bool = False
                      ) -> tuple[jax.Array, AttentionCache]:
        """`mix` of q `[B,T,H,D]` over the cached keys and k, and the cache holding k, v at
        `new_positions [T]` (shared by the batch). With a traced bool `skip`, the op is not
        evaluated when it is True (zeros out) while the cache is still written (Oryx). `fresh`:
        the cache holds nothing yet, so q attends to k alone, causally, without explicit
        positions (the fast rungs; `TokenContext.fresh_cache`)."""
        # k, v pass through the cache's dtype either way, as a later step reads them.
        keys, values = k.astype(cache.keys.dtype), v.astype(cache.values.dtype)
        positions = {}
        if not fresh:
            keys = jnp.concatenate([cache.keys, keys], axis=1)
            values = jnp.concatenate([cache.values, values], axis=1)
            # XLA: no fast rung takes explicit positions (a layer set to one would raise).
            positions = dict(q_positions=new_positions,
                             kv_positions=jnp.concatenate([cache.positions, new_positions]),
                             implementation="xla")
        # A cache of L entries keeps only the last L keys (a windowed LMCache past its max_len,
        # or a window larger than max_len): each query sees at most L, however the tokens are
        # split into calls (one call saw all of its tokens, a one-token step L + 1).
        length = cache.positions.shape[0]
        if (self.window is None or self.window > length) and (not fresh or k.shape[1] > length):
            positions["window"] = length

        def attend(q, keys, values):
            return self.mix(q, keys.astype(q.dtype), values.astype(q.dtype), **positions)

        args = (q, keys, values)
        out = attend(*args) if skip is None else unless(skip, attend, *args)
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

