"""Oryx: one block that runs softmax attention or a linear mixer per token (block type "oryx").

Both modes read the same shared parts of a linear mixer, Gated DeltaNet (`linear_mixer="gdn"`,
`nn/gated_deltanet.py`) or Mamba-2 (`"mamba2"`, `nn/mamba2.py`):

    GDN      k, v = silu(conv(W_K x)), silu(conv(W_V x)); k ← k/‖k‖         shared (H heads)
             linear mode: q = l2(silu(conv(W_Q^lin x))); gated delta rule (β, decay)
             out = W_O · (RMSNorm(o)·γ ⊙ silu(W_G x))                             shared
    Mamba-2  k = B = silu(conv(W_B x)) [G, N], v = x = silu(conv(W_x x)) [H, P]     shared
             linear mode: q = C = silu(conv(W_C x)); SSD with dt, A, and the D skip
             out = W_out · RMSNorm_G(o ⊙ silu(W_z x))                             shared
    attention mode (both): q = RoPE(W_Q^att x);  o = softmax(q·RoPE(k)ᵀ/√d_k) v    (causal)

One head structure for both modes, the linear mixer's own: GDN's H heads, and for Mamba-2 its
G query/key groups of size N, each over its H/G value heads (SSD's duality makes Mamba-2
multi-value attention: C, B, x are its query, key, value; Dao & Gu 2024, §7.2); attention mode
computes that structure as G attention heads whose values are their H/G value heads side by
side (on an accelerator the flash / cuDNN kernels run them as one head of the head dim per
value slice: `value_heads` in `hybrid_jax/ops/attention.py`). Per mode only the query and the
linear mixer's small parameters differ (GDN: β / decay projections, A_log, dt_bias; Mamba-2: dt
projection, dt_bias, A_log, D).

Shared fraction (`shared_fraction`). Mamba-2's B/C (and so both queries) are G·N wide, small
next to x, z, out (2·d each): oryx-mamba2-130m shares 94 % of each block, where GDN-mode
blocks of one head width for all projections (4·d² shared, 2·d² per mode, a SwiGLU FFN of
8d/3) share ~86 %. GDN's `expand_v` 2 (its paper's value width; values of 2·head_dim in both
modes) raises GDN's share; the oryx-gdn presets keep 1 (attention-sized values).

The per-token mode array `[B, T]` (0 = linear, 1 = attention) is the context extra "mode"
(`MODE`); a context without it runs every token in `default_mode` (attention unless set).
Every token's key and value enter both the linear state and the KV cache whatever its mode:
an attention token attends to every earlier key, a linear token reads a state that holds
every earlier token.

Cost. Training runs the linear mixer's chunked recurrence on every token (its state must see
them all) and attention on the attention-mode rows only (`active_queries`: the flash kernels
skip blocks of linear-mode rows; cuDNN and XLA compute every row and zero the others), then
selects per token; each mixer is skipped by a `lax.cond` when no token of the batch is in its
mode (fixed all-linear / all-attention schedules pay one; `flops.py` counts the same).
Decoding always runs the linear recurrence (its state must take every token) and writes the KV
cache, and evaluates attention under a `lax.cond` only when some token of the call is in
attention mode: a single-token step in linear mode, and a prefill of a linear-mode prompt,
cost the linear mixer plus the cache write, not attention.

Speculative decoding (`hybrid_jax.speculative`) decodes with `ctx.record_steps`: the linear
state after each new token and the convs' inputs are kept (`LinearSteps`), so the caches can be
rolled back to any prefix of the call's tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.cache import ConvHistory, LinearSteps, OryxCache
from hybrid_jax.config import ModelConfig, check_rope_theta
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.attention import AttentionMixer, AttentionOptions
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import unless
from hybrid_jax.nn.gated_deltanet import GatedDeltaNetMixer, GatedDeltaNetOptions
from hybrid_jax.nn.mamba2 import Mamba2Mixer, Mamba2Options
from hybrid_jax.ops.scan import varying_scan

MODE = "mode"  # the TokenContext extra holding the per-token modes
LINEAR, ATTENTION = 0, 1
MODE_NAMES = {"linear": LINEAR, "attention": ATTENTION}


@dataclasses.dataclass(frozen=True)
class LinearKind:
    """How Oryx uses one linear mixer: its parts W_K, W_V, W_O, every part both modes share,
    and where the keys and values are among the outputs of its `features`."""

    key: str
    value: str
    output: str
    shared: tuple[str, ...]
    key_value_features: tuple[int, int]


LINEAR_KINDS = {
    "gdn": LinearKind("k_proj", "v_proj", "o_proj",
                      ("k_proj", "v_proj", "g_proj", "o_proj", "k_conv", "v_conv", "o_norm"),
                      (1, 2)),  # features: q, k, v, g, β
    "mamba2": LinearKind("b_proj", "x_proj", "out_proj",
                         ("b_proj", "x_proj", "z_proj", "out_proj", "b_conv", "x_conv", "norm"),
                         (2, 0)),  # features: x, dt, B, C
}
MAMBA2_FIELDS = ("expand", "ssm_head_dim", "state_size", "n_groups", "conv_activation",
                 "gated_norm")


@dataclasses.dataclass(frozen=True)
class OryxOptions:
    """Options of an Oryx mixer; `num_heads`, `head_dim`, `rope_theta` default to the
    ModelConfig fields of the same name (head_dim None: d_model / num_heads).

    GDN mode uses `num_heads`, `head_dim`, `expand_v`; Mamba-2 mode `expand`, `ssm_head_dim`
    (P), `state_size` (N), `n_groups` (G: the attention mode's heads) as `Mamba2Options`."""

    linear_mixer: str = "gdn"
    num_heads: int = 4
    head_dim: int | None = None
    expand_v: float = 1  # GDN: value head size = expand_v · head_dim
    expand: int = 2  # Mamba-2 fields
    ssm_head_dim: int = 64
    state_size: int = 128
    n_groups: int = 1
    conv_activation: bool = True  # False with gated_norm False: attention-compatible parts
    gated_norm: bool = True  # (Mamba-2 mode; an attention layer converted, convert/oryx.py)
    conv_size: int = 4
    chunk_size: int = 64  # of the linear mixer's chunked form
    rope_theta: float = 10000.0
    rope_fraction: float = 1.0  # of the attention mode's RoPE (AttentionOptions)
    rope_scaling: tuple[float, float, float, float] | None = None
    implementation: str | None = None  # of the linear mixer's op
    conv_implementation: str | None = None  # of hybrid_jax.ops.short_conv ("xla", "pallas")
    default_mode: str = "attention"  # of every token when the context has no "mode" extra

    def __post_init__(self) -> None:
        for field, allowed in (("default_mode", MODE_NAMES), ("linear_mixer", LINEAR_KINDS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"OryxOptions.{field}={getattr(self, field)!r}: expected one "
                                 f"of {list(allowed)}")
        defaults = OryxOptions.__dataclass_fields__
        unused = ([f for f in MAMBA2_FIELDS if getattr(self, f) != defaults[f].default]
                  if self.linear_mixer == "gdn" else
                  ["expand_v"] if self.expand_v != defaults["expand_v"].default else [])
        if unused:
            raise ValueError(f"OryxOptions: {unused} do not apply to linear_mixer="
                             f"{self.linear_mixer!r}")
        check_rope_theta("OryxOptions", self.rope_theta)

    def linear_options(self) -> GatedDeltaNetOptions | Mamba2Options:
        if self.linear_mixer == "mamba2":
            return Mamba2Options(**{f: getattr(self, f) for f in MAMBA2_FIELDS},
                                 conv_size=self.conv_size, chunk_size=self.chunk_size,
                                 implementation=self.implementation,
                                 conv_implementation=self.conv_implementation)
        return GatedDeltaNetOptions(num_heads=self.num_heads, head_dim=self.head_dim,
                                    expand_v=self.expand_v, conv_size=self.conv_size,
                                    chunk_size=self.chunk_size,
                                    implementation=self.implementation,
                                    conv_implementation=self.conv_implementation)

    def attention_options(self) -> AttentionOptions:
        rope = dict(rope_theta=self.rope_theta, rope_fraction=self.rope_fraction,
                    rope_scaling=self.rope_scaling)
        if self.linear_mixer == "mamba2":  # one attention head per B/C group
            return AttentionOptions(num_heads=self.n_groups, head_dim=self.state_size, **rope)
        return AttentionOptions(num_heads=self.num_heads, head_dim=self.head_dim, **rope)

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


def _step_by_step(recurrence, features, state):
    """`recurrence` one token at a time over the `[B, T, ...]` features from `state`: the
    outputs `[B, T, ...]` and the state after each token `[B, T, ...]`."""
    def step(state, features_t):
        out, state = recurrence(*(f[:, None] for f in features_t), state=state)
        return state, (out[:, 0], state)

    # From a fresh cache's zeros too, in a caller's shard_map.
    _, (out, states) = varying_scan(step, state, [jnp.moveaxis(f, 1, 0) for f in features])
    return jnp.moveaxis(out, 0, 1), jnp.moveaxis(states, 0, 1)


@register_mixer_block("oryx", OryxOptions,
                      "Oryx: attention or a linear mixer (GDN / Mamba-2) per token, shared "
                      "K/V/G/O")
class OryxMixer(nnx.Module):
    """The Oryx mixer (module docstring). `linear` is the linear mixer and owns every shared
    part; `attention` holds its own W_Q and RoPE and takes W_K, W_V, W_O from `linear` (its
    attention op runs on the shared convolved keys/values)."""

    def __init__(self, config: ModelConfig, options: OryxOptions, *, rngs: nnx.Rngs):
        options.check(config)
        self.default_mode = options.default_mode
        self.kind = kind = LINEAR_KINDS[options.linear_mixer]
        mixer = Mamba2Mixer if options.linear_mixer == "mamba2" else GatedDeltaNetMixer
        self.linear = mixer(config, options.linear_options(), rngs=rngs)
        shared = {"k_proj": getattr(self.linear, kind.key),
                  "v_proj": getattr(self.linear, kind.value),
                  "o_proj": getattr(self.linear, kind.output)}
        self.attention = AttentionMixer(config, options.attention_options(), rngs=rngs,
                                        shared=shared)
        self.deepnorm_scaled = tuple(f"linear.{name}" for name in self.linear.deepnorm_scaled)

    def _features(self, x_BTD, ctx: TokenContext, conv_caches=None):
        """The linear mode's inputs, the attention mode's q, k `[B,T,G,K]` and values grouped
        per key head `[B,T,G,(H/G)·V]`, and the convs' new caches."""
        *linear_in, convs = self.linear.features(x_BTD, ctx.segment_ids, conv_caches)
        k, v = (linear_in[i] for i in self.kind.key_value_features)
        rope, positions = self.attention.rope, ctx.positions
        q_att, k_att = rope(self.attention.q_proj(x_BTD), positions), rope(k, positions)
        v_att = v.reshape(*v.shape[:2], k.shape[2], -1)
        return linear_in, (q_att, k_att, v_att), convs

    @staticmethod
    def _select(mode_BT, o_att, o_lin) -> jax.Array:
        """Each token's output in its mode; attention's `[B,T,G,(H/G)·V]` as `[B,T,H,V]`."""
        return jnp.where((mode_BT == ATTENTION)[:, :, None, None],
                         o_att.reshape(o_lin.shape).astype(o_lin.dtype), o_lin)

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        mode = modes_of(ctx, self.default_mode)
        linear_in, attention_in, _ = self._features(x_BTD, ctx)
        segments = ctx.segment_ids

        def linear(*a):
            return self.linear.recurrence(*a, segment_ids=segments)[0]

        # Only the attention-mode rows of attention are used: the flash kernel skips blocks of
        # linear-mode rows (half of random_chunks training), forward and backward.
        active = (mode == ATTENTION) if MODE in ctx.extras else None

        def attend(q, k, v):
            return self.attention.mix(q, k, v, segment_ids=segments,
                                      segment_extents=ctx.segment_extents, active_queries=active)

        o_lin = unless(jnp.all(mode == ATTENTION), linear, *linear_in)
        o_att = unless(jnp.all(mode == LINEAR), attend, *attention_in)
        return self.linear.output(self._select(mode, o_att, o_lin), x_BTD)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> OryxCache:
        """The linear mixer's cache and a KV cache of G key heads and `[(H/G)·V]` values."""
        value_width = int(np.prod(getattr(self.linear, self.kind.value).kernel.shape[1:]))
        return OryxCache(linear=self.linear.init_cache(batch, max_len, dtype),
                         attention=self.attention.init_cache(
                             batch, max_len, dtype,
                             value_dim=value_width // self.attention.num_kv_heads))

    def decode(self, x_BTD: jax.Array, cache: OryxCache, ctx: TokenContext
               ) -> tuple[jax.Array, OryxCache]:
        """Continues both states with every token; attention only if a token is in its mode.
        With `ctx.record_steps` the linear cache becomes a `LinearSteps` (module docstring)."""
        mode = modes_of(ctx, self.default_mode)
        lin = cache.linear
        record = ctx.record_steps
        conv_caches = [ConvHistory(c.inputs) for c in lin.convs] if record else lin.convs
        linear_in, (q, k, v), convs = self._features(x_BTD, ctx, conv_caches)
        if record:
            o_lin, states = _step_by_step(self.linear.recurrence, linear_in, lin.state)
            linear_cache = LinearSteps(conv_inputs=[c.inputs for c in convs],
                                       states=states.astype(lin.state.dtype), cache_type=type(lin))
        else:
            o_lin, state = self.linear.recurrence(*linear_in, state=lin.state)
            linear_cache = type(lin)(*convs, state=state.astype(lin.state.dtype))
        o_att, kv_cache = self.attention.attend_cached(
            q, k, v, cache.attention, ctx.positions[0].astype(jnp.int32),
            skip=jnp.all(mode == LINEAR), fresh=ctx.fresh_cache)
        new_cache = OryxCache(linear=linear_cache, attention=kv_cache)
        return self.linear.output(self._select(mode, o_att, o_lin), x_BTD), new_cache


def shared_fraction(module: nnx.Module) -> float:
    """The fraction of parameters of `module` (an Oryx mixer, a block or a model) in the parts
    shared by both modes: the Oryx mixers' shared parts (`LinearKind.shared`) and everything
    outside the mixers (FFNs, norms, embeddings). Shared parameters are counted once."""
    total = sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
    per_mode = 0
    for _, node in nnx.iter_graph(module):
        if isinstance(node, OryxMixer):
            mixer = sum(x.size for x in jax.tree.leaves(nnx.state(node, nnx.Param)))
            parts = [getattr(node.linear, name) for name in node.kind.shared]
            shared = sum(x.size for part in parts if part is not None
                         for x in jax.tree.leaves(nnx.state(part, nnx.Param)))
            per_mode += mixer - shared
    return 1.0 - per_mode / total
