"""Oryx: one block that runs softmax attention or a linear mixer per token (block type "oryx").

Both modes read the same shared parts of a Gated DeltaNet mixer (`nn/gated_deltanet.py`):

    k, v = silu(conv_4(W_K x)), silu(conv_4(W_V x));  k ← k/‖k‖     shared (H heads of size D)
    linear mode:    q = l2(silu(conv_4(W_Q^lin x)));  o = gated delta rule (β, g = decay)
    attention mode: q = RoPE(W_Q^att x);  o = softmax(q·RoPE(k)ᵀ/√D) v   (causal)
    out = W_O · (RMSNorm(o)·γ ⊙ silu(W_G x))                          shared

One MHA head structure (H heads of size D, value size D) for both modes; per mode only W_Q and
the linear mixer's small parameters (β and decay projections, A_log, dt_bias) differ. The
shared fraction (`shared_fraction`): 4·d² + convs + norm of the mixer's ≈ 6·d², ~ 67 % of the
mixer and ~ 86 % of the block with a SwiGLU FFN of width 8d/3 (oryx-gdn-tiny: 85.7 % of a
block, 87.4 % of the model with its embeddings; oryx-gdn-130m 85.5 % / 89.6 %). The paper's
≥ 90 % is not reached at these shapes: its value/gate widths are not fixed here (expand_v 1).

The per-token mode array `[B, T]` (0 = linear, 1 = attention) is the context extra "mode"
(`MODE`); a context without it runs every token in `default_mode` (attention unless set).
Every token's key and value enter both the linear state and the KV cache whatever its mode:
an attention token attends to every earlier key, a linear token reads a state that holds
every earlier token.

Cost. Training computes both modes on every token and selects per token (the cost of both
mixers: attention plus the chunked recurrence), each skipped by a `lax.cond` when no token of
the batch is in its mode (fixed all-linear / all-attention schedules pay one). Decoding always
runs the linear recurrence (its state must take every token) and writes the KV cache, and
evaluates attention under a `lax.cond` only when some token of the call is in attention mode:
a single-token step in linear mode, and a prefill of a linear-mode prompt, cost the linear
mixer plus the cache write, not attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.cache import GatedDeltaNetCache, OryxCache
from hybrid_jax.config import ModelConfig
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.attention import AttentionMixer, AttentionOptions
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.gated_deltanet import GatedDeltaNetMixer, GatedDeltaNetOptions

MODE = "mode"  # the TokenContext extra holding the per-token modes
LINEAR, ATTENTION = 0, 1
MODE_NAMES = {"linear": LINEAR, "attention": ATTENTION}
LINEAR_MIXERS = ("gdn",)
SHARED_PARTS = ("k_proj", "v_proj", "g_proj", "o_proj", "k_conv", "v_conv", "o_norm")


@dataclasses.dataclass(frozen=True)
class OryxOptions:
    """Options of an Oryx mixer; `num_heads`, `head_dim`, `rope_theta` default to the
    ModelConfig fields of the same name (head_dim None: d_model / num_heads)."""

    linear_mixer: str = "gdn"
    num_heads: int = 4
    head_dim: int | None = None
    conv_size: int = 4
    chunk_size: int = 64  # of the linear mixer's chunked form
    rope_theta: float = 10000.0
    implementation: str | None = None  # of the linear mixer's op
    default_mode: str = "attention"  # of every token when the context has no "mode" extra

    def __post_init__(self) -> None:
        for field, allowed in (("default_mode", MODE_NAMES), ("linear_mixer", LINEAR_MIXERS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"OryxOptions.{field}={getattr(self, field)!r}: expected one "
                                 f"of {list(allowed)}")

    def linear_options(self) -> GatedDeltaNetOptions:
        return GatedDeltaNetOptions(num_heads=self.num_heads, head_dim=self.head_dim,
                                    expand_v=1, conv_size=self.conv_size,
                                    chunk_size=self.chunk_size,
                                    implementation=self.implementation)

    def attention_options(self) -> AttentionOptions:
        return AttentionOptions(num_heads=self.num_heads, head_dim=self.head_dim,
                                rope_theta=self.rope_theta)

    def check(self, model: ModelConfig) -> None:
        self.linear_options().check(model)
        self.attention_options().check(model)


def modes_of(ctx: TokenContext, default: str) -> jax.Array:
    """The context's `[B, T]` mode array as int32 (concrete arrays are checked to be 0 / 1);
    without a "mode" extra, every token in mode `default` ("linear" / "attention")."""
    if MODE not in ctx.extras:
        return jnp.full(ctx.positions.shape, MODE_NAMES[default], jnp.int32)
    mode = ctx.extras[MODE]
    if mode.ndim != 2:
        raise ValueError(f"extras[{MODE!r}]: expected a [batch, time] array of 0 (linear) / 1 "
                         f"(attention), got shape {list(mode.shape)}")
    if not isinstance(mode, jax.core.Tracer):
        bad = sorted(set(np.unique(np.asarray(mode)).tolist()) - {LINEAR, ATTENTION})
        if bad:
            raise ValueError(f"extras[{MODE!r}]: expected modes 0 (linear) / 1 (attention), "
                             f"found {bad}")
    return mode.astype(jnp.int32)


def _unless(skip: jax.Array, fn, *args) -> jax.Array:
    """`fn(*args)`, or zeros of its shape without evaluating it when the bool `skip` is True."""
    shape = jax.eval_shape(fn, *args)
    return jax.lax.cond(skip, lambda *_: jnp.zeros(shape.shape, shape.dtype), fn, *args)


@register_mixer_block("oryx", OryxOptions,
                      "Oryx: attention or a linear mixer per token, shared K/V/G/O")
class OryxMixer(nnx.Module):
    """The Oryx mixer (module docstring). `linear` is a Gated DeltaNet mixer that owns every
    shared part; `attention` holds its own W_Q and RoPE and takes W_K, W_V, W_O from `linear`
    (its attention op runs on the shared convolved keys/values)."""

    deepnorm_scaled = ("linear.v_proj", "linear.o_proj")

    def __init__(self, config: ModelConfig, options: OryxOptions, *, rngs: nnx.Rngs):
        options.check(config)
        self.default_mode = options.default_mode
        self.linear = GatedDeltaNetMixer(config, options.linear_options(), rngs=rngs)
        shared = {name: getattr(self.linear, name) for name in ("k_proj", "v_proj", "o_proj")}
        self.attention = AttentionMixer(config, options.attention_options(), rngs=rngs,
                                        shared=shared)

    def _features(self, x_BTD, ctx: TokenContext, conv_caches=None):
        q_lin, k, v, g, beta, convs = self.linear.features(x_BTD, ctx.segment_ids, conv_caches)
        rope, positions = self.attention.rope, ctx.positions
        q_att, k_att = rope(self.attention.q_proj(x_BTD), positions), rope(k, positions)
        return (q_lin, k, v, g, beta), (q_att, k_att, v), convs

    @staticmethod
    def _select(mode_BT, o_att, o_lin) -> jax.Array:
        return jnp.where((mode_BT == ATTENTION)[:, :, None, None], o_att.astype(o_lin.dtype),
                         o_lin)

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        mode = modes_of(ctx, self.default_mode)
        linear_in, attention_in, _ = self._features(x_BTD, ctx)
        segments = ctx.segment_ids

        def linear(*a):
            return self.linear.recurrence(*a, segment_ids=segments)[0]

        def attend(q, k, v):
            return self.attention.mix(q, k, v, segment_ids=segments,
                                      segment_extents=ctx.segment_extents)

        o_lin = _unless(jnp.all(mode == ATTENTION), linear, *linear_in)
        o_att = _unless(jnp.all(mode == LINEAR), attend, *attention_in)
        return self.linear.output(self._select(mode, o_att, o_lin), x_BTD)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> OryxCache:
        return OryxCache(linear=self.linear.init_cache(batch, max_len, dtype),
                         attention=self.attention.init_cache(batch, max_len, dtype))

    def decode(self, x_BTD: jax.Array, cache: OryxCache, ctx: TokenContext
               ) -> tuple[jax.Array, OryxCache]:
        """Continues both states with every token; attention only if a token is in its mode."""
        mode = modes_of(ctx, self.default_mode)
        lin = cache.linear
        linear_in, (q, k, v), convs = self._features(
            x_BTD, ctx, [lin.q_conv, lin.k_conv, lin.v_conv])
        o_lin, state = self.linear.recurrence(*linear_in, state=lin.state)
        o_att, kv_cache = self.attention.attend_cached(
            q, k, v, cache.attention, ctx.positions[0].astype(jnp.int32),
            skip=jnp.all(mode == LINEAR))
        new_cache = OryxCache(linear=GatedDeltaNetCache(*convs, state=state.astype(
            lin.state.dtype)), attention=kv_cache)
        return self.linear.output(self._select(mode, o_att, o_lin), x_BTD), new_cache


def shared_fraction(module: nnx.Module) -> float:
    """The fraction of parameters of `module` (an Oryx mixer, a block or a model) in the parts
    shared by both modes: the Oryx mixers' `SHARED_PARTS` and everything outside the mixers
    (FFNs, norms, embeddings). Shared parameters are counted once."""
    total = sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
    per_mode = 0
    for _, node in nnx.iter_graph(module):
        if isinstance(node, OryxMixer):
            mixer = sum(x.size for x in jax.tree.leaves(nnx.state(node, nnx.Param)))
            shared = sum(x.size for name in SHARED_PARTS
                         for x in jax.tree.leaves(nnx.state(getattr(node.linear, name),
                                                            nnx.Param)))
            per_mode += mixer - shared
    return 1.0 - per_mode / total
