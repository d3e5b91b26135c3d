"""Native Hybrid Attention layer (NHA, Du et al. 2025): gated slots and a sliding window under
one softmax.

Per token, with H query heads and G kv heads of size K, M slots per kv head and window w:

    q, k, v = W_q x, W_k x, W_v x            ([H, K], [G, K], [G, K]; optional SiLU short convs)
    slot branch     φ(q), φ(k)               φ = swish (the feature map)
    window branch   RoPE(q), RoPE(k)         (RoPE on the window branch only)
    v = silu(v),  g = logsigmoid(W_f x) / τ (τ = 8),  s = 1 − e^g         ([G, M])
    o = native_hybrid_attention(...)         one softmax over [M slots ; w window keys]
    out = W_o · RMSNorm(silu(o))             (norm over all heads)

as in JusenD/NHA's `NativeHybridAttention` layer at its original release (commit 7dffc04: the
slot inputs shifted by w, so slots and window are disjoint), with the swish feature map that
its GSA base applies on the slot branch. Logit scale K^{-1/2} on both branches.

`window` is an inference-time knob: `LanguageModel.with_window(...)` changes it on a trained
model without new parameters. 0 makes the layer a pure GSA recurrence, None (or w >= T) full
causal attention. Inside a `ModelConfig` an unset `window` takes `ModelConfig.window`, which
defaults to None (full attention): the NHA presets set `window=32` at the model level.

Decoding keeps an `NHACache`: the slots plus a ring buffer of the last `window` tokens (or of
`max_len` when `window` is None or larger), so its memory does not grow with the sequence.
Packed documents (`segment_ids`) stay apart: windows never cross a document start and the
slots restart there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import NHACache
from hybrid_jax.config import ModelConfig, check_rope_scaling, check_rope_theta
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, norm, output_std, param_dtype
from hybrid_jax.nn.gsa import slot_attention_output
from hybrid_jax.nn.layers import Linear, RoPE, ShortConv
from hybrid_jax.ops import context_parallel
from hybrid_jax.ops.attention import rotary_dim
from hybrid_jax.ops.nha import (
    EMPTY_SLOTS,
    native_hybrid_attention,
    native_hybrid_attention_step,
    nha_empty_state,
)
from hybrid_jax.sharding import constrain

FEATURE_MAPS = {"swish": jax.nn.silu, "identity": lambda x: x}
VALUE_ACTIVATIONS = ("silu", "identity")


@dataclasses.dataclass(frozen=True)
class NHAOptions:
    """Options of an NHA layer; `num_heads`, `num_kv_heads`, `head_dim`, `window`,
    `rope_theta` and `rope_fraction` default to the ModelConfig fields of the same name."""

    num_heads: int = 4
    num_kv_heads: int | None = None  # G: heads of the slots and window keys/values (GQA)
    head_dim: int | None = None  # K = V; None: d_model // num_heads
    num_slots: int = 64  # M, per kv head
    window: int | None = 32  # w; 0: slots only (GSA); None: full causal attention
    gate_logit_normalizer: float = 8.0  # τ in g = logsigmoid(W_f x) / τ
    feature_map: str = "swish"  # φ of the slot branch: "swish" or "identity"
    short_conv: bool = False  # SiLU short convs on q, k, v (off in the original configs)
    conv_size: int = 4
    rope_theta: float = 10000.0
    rope_fraction: float = 1.0
    rope_scaling: tuple[float, float, float, float] | None = None  # Llama-3 (see ops)
    qkv_bias: bool = False  # biases on q, k, v (a converted Qwen2)
    # The attention-compatible form of a converted transformer: "identity" values and no
    # output norm make window >= T exactly its softmax attention (hybrid_jax.convert.nha).
    value_activation: str = "silu"  # "silu" or "identity"
    output_norm: bool = True  # W_o·RMSNorm(silu(o)); False: W_o·o
    empty_slots: str = "mask"  # "sink": the original code's zero-value sinks (see the op)
    chunk_size: int = 64  # of the chunked form, a power of two
    implementation: str | None = None  # of hybrid_jax.ops.native_hybrid_attention
    conv_implementation: str | None = None  # of hybrid_jax.ops.short_conv ("xla", "pallas")

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_slots", "conv_size", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"NHAOptions.{name}={value!r}: expected a positive integer")
        for name in ("num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"NHAOptions.{name}={value!r}: expected a positive integer "
                                 "or None")
        if self.chunk_size & (self.chunk_size - 1):
            raise ValueError(f"NHAOptions.chunk_size={self.chunk_size}: expected a power of two")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 0):
            raise ValueError(f"NHAOptions.window={self.window!r}: expected an integer >= 0 "
                             "(0: slots only) or None (full causal attention)")
        if not self.gate_logit_normalizer > 0:
            raise ValueError(f"NHAOptions.gate_logit_normalizer={self.gate_logit_normalizer!r}:"
                             " expected a positive number")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"NHAOptions.feature_map={self.feature_map!r}: expected one of "
                             f"{sorted(FEATURE_MAPS)}")
        if self.value_activation not in VALUE_ACTIVATIONS:
            raise ValueError(f"NHAOptions.value_activation={self.value_activation!r}: expected "
                             f"one of {sorted(VALUE_ACTIVATIONS)}")
        if self.empty_slots not in EMPTY_SLOTS:
            raise ValueError(f"NHAOptions.empty_slots={self.empty_slots!r}: expected one of "
                             f"{list(EMPTY_SLOTS)}")
        rotary_dim(8, self.rope_fraction)  # validates the fraction
        check_rope_theta("NHAOptions", self.rope_theta)
        if self.rope_scaling is not None:
            check_rope_scaling("NHAOptions", self.rope_scaling)

    def check(self, model: ModelConfig) -> None:
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_kv_heads={kv} does not divide num_heads={self.num_heads}")
        if self.head_dim is None and model.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide d_model="
                             f"{model.d_model} (set head_dim)")


@register_mixer_block("nha", NHAOptions,
                      "Native Hybrid Attention (gated slots + sliding window under one softmax)")
class NHAMixer(nnx.Module):
    """The NHA mixer (see the module docstring). Parts: `inputs(x, ctx)` (the op's q, k, v, s,
    g and window q, k; short convs), the op `native_hybrid_attention`, `slot_attention_output`.
    """

    deepnorm_scaled = ("v_proj", "o_proj")

    def __init__(self, config: ModelConfig, options: NHAOptions, *, rngs: nnx.Rngs):
        options.check(config)
        self.num_heads = h = options.num_heads
        self.num_kv_heads = g = options.num_kv_heads or h
        self.head_dim = k = options.head_dim or config.d_model // h
        self.num_slots = m = options.num_slots
        self.window, self.empty_slots = options.window, options.empty_slots
        self.gate_logit_normalizer = options.gate_logit_normalizer
        self.feature_map = options.feature_map
        self.chunk_size, self.implementation = options.chunk_size, options.implementation
        self.dtype = compute_dtype(config)
        self.value_activation = options.value_activation
        d, kw = config.d_model, dense_kwargs(config, rngs)
        qkv = dict(kw, use_bias=options.qkv_bias)
        self.q_proj = Linear(d, (h, k), axes=("embed", "heads", "head_dim"), **qkv)
        self.k_proj = Linear(d, (g, k), axes=("embed", "kv_heads", "head_dim"), **qkv)
        self.v_proj = Linear(d, (g, k), axes=("embed", "kv_heads", "head_dim"), **qkv)
        self.f_proj = Linear(d, (g, m), axes=("embed", "kv_heads", "slots"), **kw)
        self.q_conv, self.k_conv, self.v_conv = (
            ShortConv(channels, options.conv_size, rngs=rngs, axis=axis, dtype=self.dtype,
                      param_dtype=param_dtype(config),
                      implementation=options.conv_implementation) if options.short_conv else None
            for channels, axis in ((h * k, "heads"), (g * k, "kv_heads"), (g * k, "kv_heads")))
        self.rope = RoPE(theta=options.rope_theta, fraction=options.rope_fraction,
                         scaling=options.rope_scaling)
        self.o_norm = norm(config, h * k) if options.output_norm else None
        self.o_proj = Linear((h, k), d, axes=("heads", "head_dim", "embed"),
                             **{**kw, "std": output_std(config)})

    def _convolve(self, x_BTHK, conv, segment_ids_BT, cache):
        """The short conv over the flattened heads: parallel, or continuing `cache`."""
        if conv is None:
            return x_BTHK, None
        flat = x_BTHK.reshape(*x_BTHK.shape[:2], -1)
        y, cache = (conv(flat, segment_ids_BT), None) if cache is None else conv.decode(flat,
                                                                                        cache)
        return y.reshape(x_BTHK.shape), cache

    def inputs(self, x_BTD, ctx: TokenContext, caches=(None, None, None)):
        """The op's inputs (q, k, v, s, g and the window-branch q, k) and the new conv caches
        (parallel short convs, or continuing `caches` when decoding)."""
        positions_BT, segment_ids_BT = ctx.positions, ctx.segment_ids
        qkv, new_caches = [], []
        for proj, conv, cache in zip((self.q_proj, self.k_proj, self.v_proj),
                                     (self.q_conv, self.k_conv, self.v_conv), caches,
                                     strict=True):
            x, cache = self._convolve(proj(x_BTD), conv, segment_ids_BT, cache)
            qkv.append(x)
            new_caches.append(cache)
        q, k, v = qkv
        heads, kv_heads = ("batch", "seq", "heads", "head_dim"), ("batch", "seq", "kv_heads",
                                                                    "head_dim")
        phi = FEATURE_MAPS[self.feature_map]
        g = jax.nn.log_sigmoid(self.f_proj(x_BTD).astype(jnp.float32)) / self.gate_logit_normalizer
        inputs = dict(
            q=constrain(phi(q), heads), k=constrain(phi(k), kv_heads),
            v=constrain(jax.nn.silu(v) if self.value_activation == "silu" else v, kv_heads),
            s=-jnp.expm1(g), g=g,
            q_window=constrain(self.rope(q, positions_BT), heads),
            k_window=constrain(self.rope(k, positions_BT), kv_heads))
        return inputs, new_caches

    def _output(self, o_BTHK: jax.Array) -> jax.Array:
        if self.o_norm is None:
            return self.o_proj(o_BTHK.astype(self.dtype))
        return slot_attention_output(self.o_norm, self.o_proj, o_BTHK)

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        inputs, _ = self.inputs(x_BTD, ctx)
        window = x_BTD.shape[1] if self.window is None else self.window
        o = context_parallel.native_hybrid_attention(
            **inputs, window=window, segment_ids=ctx.segment_ids, empty_slots=self.empty_slots,
            chunk_size=self.chunk_size, implementation=self.implementation)
        return self._output(o)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> NHACache:
        """Slots in float32 and a ring of min(window, max_len) tokens (keys/values in `dtype`):
        no more tokens than `max_len` can ever be in a window."""
        ring = max_len if self.window is None else min(self.window, max_len)
        k = self.head_dim
        state = nha_empty_state(batch, self.num_kv_heads, k, k, self.num_slots, ring,
                                ring_dtype=dtype)
        convs = (None if conv is None else conv.init_cache(batch, channels, dtype)
                 for conv, channels in ((self.q_conv, self.num_heads * k),
                                        (self.k_conv, self.num_kv_heads * k),
                                        (self.v_conv, self.num_kv_heads * k)))
        return NHACache(state, *convs)

    def decode(self, x_BTD: jax.Array, cache: NHACache, ctx: TokenContext
               ) -> tuple[jax.Array, NHACache]:
        """Continues from `cache`: one token with the decode step, a prefill chunked."""
        inputs, convs = self.inputs(x_BTD, ctx, caches=(cache.q_conv, cache.k_conv,
                                                        cache.v_conv))
        if x_BTD.shape[1] == 1:
            o, state = native_hybrid_attention_step(
                cache.state, **{name: x[:, 0] for name, x in inputs.items()},
                empty_slots=self.empty_slots)
            o = o[:, None]
        else:
            o, state = native_hybrid_attention(
                **inputs, window=cache.state.keys.shape[1], initial_state=cache.state,
                return_final_state=True, empty_slots=self.empty_slots,
                chunk_size=self.chunk_size, implementation=self.implementation)
        return self._output(o), NHACache(state, *convs)

