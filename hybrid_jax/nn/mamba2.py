"""Mamba-2 (Dao & Gu, 2024): a selective state-space mixer computed with the SSD algorithm.

Per token, with `d_inner = expand·d_model` split into `H = d_inner / P` heads of size P:

    z, x, B, C, dt_raw = projections of the input     (x: [H, P], B, C: [G, N], dt_raw: [H])
    x, B, C = silu(causal depthwise conv_4(x, B, C))
    dt = softplus(dt_raw + dt_bias),  A = −exp(A_log)
    S_t = exp(dt·A)·S_{t−1} + dt·x_t B_tᵀ,  y_t = S_t C_t + D·x_t       (state [H, P, N])
    out = W_out · RMSNorm_G(y ⊙ silu(z))            (RMSNorm over each of the G groups)

as in mamba_ssm's `Mamba2Simple` and fla's `Mamba2` layer. The fused `in_proj` of the references
is kept as four projections (z, x, [B; C], dt) — the same map, with head-shaped outputs that
shard along heads — and the depthwise conv over `[x; B; C]` as one conv on x and one on [B; C].
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import Mamba2Cache
from hybrid_jax.config import ModelConfig
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, output_std
from hybrid_jax.nn.layers import GatedRMSNorm, Linear, ShortConv, param
from hybrid_jax.ops import context_parallel
from hybrid_jax.ops.ssd import ssd, ssd_step
from hybrid_jax.sharding import constrain


@dataclasses.dataclass(frozen=True)
class Mamba2Options:
    """Options of a Mamba-2 layer.

    `ssm_head_dim` (P) is not called `head_dim` so that it does not default to the attention
    head size of `ModelConfig.head_dim` in hybrid models.
    """

    expand: int = 2  # d_inner = expand · d_model
    ssm_head_dim: int = 64  # P; heads = d_inner / P
    state_size: int = 128  # N
    n_groups: int = 1  # G: heads share B and C within a group
    conv_size: int = 4
    chunk_size: int = 64  # of the chunked SSD form
    dt_min: float = 0.001  # dt_bias init: softplus⁻¹ of dt ~ log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    a_init_min: float = 1.0  # A_log init: log U[a_init_min, a_init_max]
    a_init_max: float = 16.0
    implementation: str | None = None  # of hybrid_jax.ops.ssd.ssd

    def __post_init__(self) -> None:
        for name in ("expand", "ssm_head_dim", "state_size", "n_groups", "conv_size",
                     "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Mamba2Options.{name}={value!r}: expected a positive integer")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"Mamba2Options: expected 0 < dt_min <= dt_max, got "
                             f"dt_min={self.dt_min}, dt_max={self.dt_max}")
        if not 0 < self.a_init_min <= self.a_init_max:
            raise ValueError(f"Mamba2Options: expected 0 < a_init_min <= a_init_max, got "
                             f"a_init_min={self.a_init_min}, a_init_max={self.a_init_max}")

    def d_inner(self, model: ModelConfig) -> int:
        return self.expand * model.d_model

    def num_heads(self, model: ModelConfig) -> int:
        return self.d_inner(model) // self.ssm_head_dim

    def check(self, model: ModelConfig) -> None:
        d_inner = self.d_inner(model)
        if d_inner % self.ssm_head_dim:
            raise ValueError(f"ssm_head_dim={self.ssm_head_dim} does not divide d_inner="
                             f"expand·d_model={d_inner}")
        heads = self.num_heads(model)
        if heads % self.n_groups:
            raise ValueError(f"n_groups={self.n_groups} does not divide the number of heads "
                             f"d_inner/ssm_head_dim={heads}")


def _dt_bias_init(options: Mamba2Options):
    """softplus⁻¹(dt) with dt log-uniform in [dt_min, dt_max], floored at dt_init_floor."""

    def init(key, shape, dtype):
        log_lo, log_hi = math.log(options.dt_min), math.log(options.dt_max)
        dt = jnp.exp(jax.random.uniform(key, shape, jnp.float32, log_lo, log_hi))
        dt = jnp.maximum(dt, options.dt_init_floor)
        return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)

    return init


def _a_log_init(options: Mamba2Options):
    def init(key, shape, dtype):
        a = jax.random.uniform(key, shape, jnp.float32, options.a_init_min, options.a_init_max)
        return jnp.log(a).astype(dtype)

    return init


@register_mixer_block("mamba2", Mamba2Options,
                      "Mamba-2 (SSD) mixer (ffn_dim=0: Mamba-2's FFN-free blocks)")
class Mamba2Mixer(nnx.Module):
    """The Mamba-2 mixer; decoding keeps a `Mamba2Cache` (conv inputs and the `[B, H, P, N]`
    float32 SSM state), so its memory does not grow with the sequence.

    Parts: `project(x)` (the un-convolved x, [B; C], z, dt), `split` (heads after the short
    convs), the op `ssd`, and `output(y, x, z)` (D skip, gated norm, `out_proj`).
    """

    deepnorm_scaled = ("x_proj", "out_proj")

    def __init__(self, config: ModelConfig, options: Mamba2Options, *, rngs: nnx.Rngs):
        options.check(config)
        self.heads = h = options.num_heads(config)
        self.head_dim = p = options.ssm_head_dim
        self.groups, self.state_size = g, n = options.n_groups, options.state_size
        self.chunk_size, self.implementation = options.chunk_size, options.implementation
        self.dtype = compute_dtype(config)
        d, kw = config.d_model, dense_kwargs(config, rngs)
        pdtype = kw["param_dtype"]
        self.z_proj = Linear(d, (h, p), axes=("embed", "heads", "head_dim"), **kw)
        self.x_proj = Linear(d, (h, p), axes=("embed", "heads", "head_dim"), **kw)
        self.bc_proj = Linear(d, (2, g, n), axes=("embed", None, None, "state"), **kw)
        self.dt_proj = Linear(d, h, axes=("embed", "heads"), **kw)
        conv_kw = dict(rngs=rngs, use_bias=True, dtype=self.dtype, param_dtype=pdtype)
        self.x_conv = ShortConv(h * p, options.conv_size, axis="heads", **conv_kw)
        self.bc_conv = ShortConv(2 * g * n, options.conv_size, **conv_kw)
        self.dt_bias = param(rngs, _dt_bias_init(options), h, jnp.float32, ("heads",))
        self.A_log = param(rngs, _a_log_init(options), h, jnp.float32, ("heads",))
        self.D = param(rngs, nnx.initializers.ones, h, jnp.float32, ("heads",))
        self.norm = GatedRMSNorm(h * p, group_size=h * p // g, norm_before_gate=False,
                                 eps=config.norm_eps, dtype=self.dtype, param_dtype=pdtype)
        self.out_proj = Linear((h, p), d, axes=("heads", "head_dim", "embed"),
                               **{**kw, "std": output_std(config)})

    def project(self, x_BTD: jax.Array):
        """The un-convolved `x [B,T,H·P]`, `[B; C] [B,T,2·G·N]`, and `z`, `dt` (float32)."""
        batch, T = x_BTD.shape[:2]
        x = self.x_proj(x_BTD).reshape(batch, T, -1)
        bc = self.bc_proj(x_BTD).reshape(batch, T, -1)
        z = constrain(self.z_proj(x_BTD), ("batch", "seq", "heads", "head_dim"))
        dt = jax.nn.softplus(self.dt_proj(x_BTD).astype(jnp.float32) + self.dt_bias[...])
        return x, bc, z, dt

    def split(self, x_conv: jax.Array, bc_conv: jax.Array):
        batch, T = x_conv.shape[:2]
        x = constrain(x_conv.reshape(batch, T, self.heads, self.head_dim),
                      ("batch", "seq", "heads", "head_dim"))
        bc = bc_conv.reshape(batch, T, 2, self.groups, self.state_size)
        return x, bc[:, :, 0], bc[:, :, 1]

    def output(self, y_BTHP: jax.Array, x_BTHP: jax.Array, z_BTHP: jax.Array) -> jax.Array:
        y = y_BTHP.astype(jnp.float32) + self.D[...][:, None] * x_BTHP.astype(jnp.float32)
        batch, T = y.shape[:2]
        y = self.norm(y.reshape(batch, T, -1), z_BTHP.reshape(batch, T, -1))
        return self.out_proj(y.reshape(z_BTHP.shape))

    def _A(self) -> jax.Array:
        return -jnp.exp(self.A_log[...])

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        segment_ids = ctx.segment_ids
        x, bc, z, dt = self.project(x_BTD)
        x, B, C = self.split(self.x_conv(x, segment_ids), self.bc_conv(bc, segment_ids))
        y = context_parallel.ssd(x, dt, self._A(), B, C, chunk_size=self.chunk_size,
                                 segment_ids=segment_ids, implementation=self.implementation)
        return self.output(y, x, z)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> Mamba2Cache:
        del max_len  # the state has a fixed size
        return Mamba2Cache(
            x_conv=self.x_conv.init_cache(batch, self.heads * self.head_dim, dtype),
            bc_conv=self.bc_conv.init_cache(batch, 2 * self.groups * self.state_size, dtype),
            ssm=jnp.zeros((batch, self.heads, self.head_dim, self.state_size), jnp.float32))

    def decode(self, x_BTD: jax.Array, cache: Mamba2Cache, ctx: TokenContext
               ) -> tuple[jax.Array, Mamba2Cache]:
        """Continues from `cache`: one token with `ssd_step`, a prefill with the chunked SSD."""
        del ctx
        x, bc, z, dt = self.project(x_BTD)
        x_conv, x_conv_cache = self.x_conv.decode(x, cache.x_conv)
        bc_conv, bc_conv_cache = self.bc_conv.decode(bc, cache.bc_conv)
        x, B, C = self.split(x_conv, bc_conv)
        if x_BTD.shape[1] == 1:
            y, state = ssd_step(cache.ssm, x[:, 0], dt[:, 0], self._A(), B[:, 0], C[:, 0])
            y = y[:, None]
        else:
            y, state = ssd(x, dt, self._A(), B, C, chunk_size=self.chunk_size,
                           initial_state=cache.ssm, return_final_state=True,
                           implementation=self.implementation)
        new_cache = Mamba2Cache(x_conv=x_conv_cache, bc_conv=bc_conv_cache,
                                ssm=state.astype(cache.ssm.dtype))
        return self.output(y, x, z), new_cache

