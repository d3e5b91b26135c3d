"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2024): the gated delta rule as a sequence mixer.

Per token, with H heads of key size K and value size V = expand_v·K:

    q, k, v = silu(causal depthwise conv_4(W_q x, W_k x, W_v x))      (q, k: [H, K]; v: [H, V])
    q, k = q / ‖q‖, k / ‖k‖
    β = σ(W_b x),  g = −exp(A_log)·softplus(W_a x + dt_bias)           ([H] each; g ≤ 0)
    S ← e^g·S;  S ← S + β·k (v − Sᵀk)ᵀ;  o = Sᵀ q / √K                  (state [H, K, V])
    out = W_o · (RMSNorm(o)·γ ⊙ silu(W_g x))                          (norm per head)

as in fla's `GatedDeltaNet` layer (`use_gate=True`): A uniform in [0, 16] stored as its log,
dt_bias = softplus⁻¹ of a log-uniform dt in [0.001, 0.1] (floored at 1e-4), no biases, the
output norm's γ `[V]` shared by the heads. Without short convs q, k, v get a plain SiLU.
The recurrence is `hybrid_jax.ops.gated_delta_rule`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import GatedDeltaNetCache
from hybrid_jax.config import ModelConfig
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, output_std, shared_or_new
from hybrid_jax.nn.layers import GatedRMSNorm, Linear, ShortConv, dt_bias_init, param, run_convs
from hybrid_jax.ops import context_parallel
from hybrid_jax.ops.attention import l2_normalize
from hybrid_jax.ops.delta_rule import gated_delta_rule, gated_delta_rule_step
from hybrid_jax.sharding import constrain


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetOptions:
    """Options of a Gated DeltaNet layer; `num_heads` and `head_dim` (the q/k head size; None:
    d_model / num_heads) default to the ModelConfig fields of the same name."""

    num_heads: int = 4
    head_dim: int | None = None
    expand_v: float = 2  # value head size = expand_v · head_dim
    conv_size: int = 4
    chunk_size: int = 64  # of the chunked gated delta rule
    use_short_conv: bool = True
    implementation: str | None = None  # of hybrid_jax.ops.gated_delta_rule
    conv_implementation: str | None = None  # of hybrid_jax.ops.short_conv ("xla", "pallas")

    def __post_init__(self) -> None:
        for name in ("num_heads", "conv_size", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GatedDeltaNetOptions.{name}={value!r}: expected a positive "
                                 "integer")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim < 1):
            raise ValueError(f"GatedDeltaNetOptions.head_dim={self.head_dim!r}: expected a "
                             "positive integer or None (d_model / num_heads)")
        if not isinstance(self.expand_v, int | float) or self.expand_v <= 0:
            raise ValueError(f"GatedDeltaNetOptions.expand_v={self.expand_v!r}: expected a "
                             "positive number")

    def key_dim(self, model: ModelConfig) -> int:
        return self.head_dim or model.d_model // self.num_heads

    def value_dim(self, model: ModelConfig) -> int:
        return round(self.expand_v * self.key_dim(model))

    def check(self, model: ModelConfig) -> None:
        if self.head_dim is None and model.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide d_model="
                             f"{model.d_model} (set head_dim)")
        key_dim = self.key_dim(model)
        # expand_v > 0, so a product close to an integer is close to one ≥ 1.
        if not math.isclose(self.expand_v * key_dim, self.value_dim(model)):
            raise ValueError(f"expand_v={self.expand_v} times head_dim={key_dim} is not a "
                             "positive integer value head size")


def _a_log_init(key, shape, dtype):
    return jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.0, 16.0)).astype(dtype)


_dt_bias_init = dt_bias_init(1e-3, 1e-1, floor=1e-4)  # fla's constants


@register_mixer_block("gdn", GatedDeltaNetOptions,
                      "Gated DeltaNet (gated delta rule, short convs, gated output norm)")
class GatedDeltaNetMixer(nnx.Module):
    """The Gated DeltaNet mixer; decoding keeps a `GatedDeltaNetCache` (the short convs' last
    inputs and the `[B, H, K, V]` float32 state), so its memory does not grow with the
    sequence.

    Parts: `projections(x)` (un-convolved q, k, v), `heads(q, k, v)` (split, L2-normalised),
    `gates(x)` (g, β), the op `gated_delta_rule`, `output(o, x)` (gated norm with `g_proj`,
    `o_proj`). `shared=` takes any of `q_proj, k_proj, v_proj, g_proj, o_proj, q_conv, k_conv,
    v_conv` owned by another mixer of the block (Oryx's shared W_K, W_V, W_G, W_O).
    """

    deepnorm_scaled = ("v_proj", "o_proj")

    def __init__(self, config: ModelConfig, options: GatedDeltaNetOptions, *, rngs: nnx.Rngs,
                 shared: dict[str, nnx.Module] | None = None):
        options.check(config)
        self.num_heads = h = options.num_heads
        self.key_dim, self.value_dim = k, v = options.key_dim(config), options.value_dim(config)
        self.chunk_size, self.implementation = options.chunk_size, options.implementation
        self.dtype = compute_dtype(config)
        d, kw = config.d_model, dense_kwargs(config, rngs)
        pdtype = kw["param_dtype"]
        part = functools.partial(shared_or_new, shared)
        head_axes = ("embed", "heads", "head_dim")
        self.q_proj = part("q_proj", lambda: Linear(d, (h, k), axes=head_axes, **kw))
        self.k_proj = part("k_proj", lambda: Linear(d, (h, k), axes=head_axes, **kw))
        self.v_proj = part("v_proj", lambda: Linear(d, (h, v), axes=head_axes, **kw))
        self.g_proj = part("g_proj", lambda: Linear(d, (h, v), axes=head_axes, **kw))
        self.a_proj = Linear(d, h, axes=("embed", "heads"), **kw)
        self.b_proj = Linear(d, h, axes=("embed", "heads"), **kw)
        conv = functools.partial(ShortConv, size=options.conv_size, axis="heads", rngs=rngs,
                                 dtype=self.dtype, param_dtype=pdtype,
                                 implementation=options.conv_implementation)
        use_conv = options.use_short_conv
        self.q_conv = part("q_conv", lambda: conv(h * k)) if use_conv else None
        self.k_conv = part("k_conv", lambda: conv(h * k)) if use_conv else None
        self.v_conv = part("v_conv", lambda: conv(h * v)) if use_conv else None
        self.A_log = param(rngs, _a_log_init, h, jnp.float32, ("heads",))
        self.dt_bias = param(rngs, _dt_bias_init, h, jnp.float32, ("heads",))
        self.o_norm = GatedRMSNorm(v, norm_before_gate=True, eps=config.norm_eps,
                                   dtype=self.dtype, param_dtype=pdtype)
        self.o_proj = part("o_proj", lambda: Linear((h, v), d, axes=("heads", "head_dim",
                                                                      "embed"),
                                                     **{**kw, "std": output_std(config)}))

    def projections(self, x_BTD: jax.Array) -> list[jax.Array]:
        """The un-convolved q, k, v, flattened to `[B, T, H·dim]` for the short convs."""
        batch, T = x_BTD.shape[:2]
        return [proj(x_BTD).reshape(batch, T, -1) for proj in (self.q_proj, self.k_proj,
                                                                self.v_proj)]

    @property
    def _convs(self) -> tuple[ShortConv, ShortConv, ShortConv]:
        return self.q_conv, self.k_conv, self.v_conv

    def heads(self, q, k, v):
        """Splits heads, L2-normalises q and k: `[B,T,H,K]`, `[B,T,H,K]`, `[B,T,H,V]`."""
        batch, T = q.shape[:2]
        names = ("batch", "seq", "heads", "head_dim")
        q, k = (constrain(l2_normalize(x.reshape(batch, T, self.num_heads, -1)), names)
                for x in (q, k))
        return q, k, constrain(v.reshape(batch, T, self.num_heads, -1), names)

    def gates(self, x_BTD: jax.Array):
        """β = σ(W_b x) and g = −exp(A_log)·softplus(W_a x + dt_bias), `[B, T, H]` float32."""
        beta = jax.nn.sigmoid(self.b_proj(x_BTD).astype(jnp.float32))
        dt = jax.nn.softplus(self.a_proj(x_BTD).astype(jnp.float32) + self.dt_bias[...])
        return -jnp.exp(self.A_log[...]) * dt, beta

    def output(self, o_BTHV: jax.Array, x_BTD: jax.Array) -> jax.Array:
        return self.o_proj(self.o_norm(o_BTHV, self.g_proj(x_BTD)))

    def features(self, x_BTD: jax.Array, segment_ids: jax.Array | None = None,
                 conv_caches: list | None = None):
        """q, k, v (`heads`), g, β and the short convs' new caches (with `conv_caches`, decoding
        continues them; else `segment_ids` reset the convs at document starts)."""
        qkv = self.projections(x_BTD)
        if self.q_conv is None:
            qkv, conv_caches = [jax.nn.silu(x) for x in qkv], [None] * 3
        else:
            qkv, conv_caches = run_convs(self._convs, qkv, segment_ids, conv_caches)
        return (*self.heads(*qkv), *self.gates(x_BTD), conv_caches)

    def recurrence(self, q, k, v, g, beta, *, segment_ids: jax.Array | None = None,
                   state: jax.Array | None = None):
        """The gated delta rule: `o [B,T,H,V]`, and with `state` (decoding: one token with the
        step, more chunked) the new state, else None."""
        if state is None:  # training / eval: the context-parallel form when the mesh has one
            return context_parallel.gated_delta_rule(
                q, k, v, g, beta, chunk_size=self.chunk_size, segment_ids=segment_ids,
                implementation=self.implementation), None
        if q.shape[1] == 1:
            o, state = gated_delta_rule_step(state, q[:, 0], k[:, 0], v[:, 0], g[:, 0],
                                             beta[:, 0])
            return o[:, None], state
        return gated_delta_rule(q, k, v, g, beta, chunk_size=self.chunk_size,
                                initial_state=state, return_final_state=True,
                                implementation=self.implementation)

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        q, k, v, g, beta, _ = self.features(x_BTD, ctx.segment_ids)
        o, _ = self.recurrence(q, k, v, g, beta, segment_ids=ctx.segment_ids)
        return self.output(o, x_BTD)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> GatedDeltaNetCache:
        del max_len  # the state has a fixed size
        h, k, v = self.num_heads, self.key_dim, self.value_dim
        convs = [None] * 3 if self.q_conv is None else [
            conv.init_cache(batch, h * dim, dtype)
            for conv, dim in zip(self._convs, (k, k, v), strict=True)]
        return GatedDeltaNetCache(*convs, state=jnp.zeros((batch, h, k, v), jnp.float32))

    def decode(self, x_BTD: jax.Array, cache: GatedDeltaNetCache, ctx: TokenContext
               ) -> tuple[jax.Array, GatedDeltaNetCache]:
        """Continues from `cache`: one token with the recurrence step, a prefill chunked."""
        del ctx
        q, k, v, g, beta, convs = self.features(x_BTD, conv_caches=cache.convs)
        o, state = self.recurrence(q, k, v, g, beta, state=cache.state)
        new_cache = GatedDeltaNetCache(*convs, state=state.astype(cache.state.dtype))
        return self.output(o, x_BTD), new_cache
