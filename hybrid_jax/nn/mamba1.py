"""Mamba-1 (Gu & Dao, 2023): the selective state-space (S6) mixer.

Per token, with `E = expand·d_model` channels, state size N and `R = dt_rank`:

    x, z = W_x u, W_z u                               (E each)
    x = silu(causal depthwise conv_4(x) + b)
    dt = softplus(W_dt (W_r x) + dt_bias),  B = W_B x,  C = W_C x      (dt: E; B, C: N)
    s_t = exp(dt ⊙ A) ⊙ s_{t−1} + (dt ⊙ x_t) B_tᵀ,  y_t = s_t C_t + D ⊙ x_t     (state [E, N])
    out = W_out (y ⊙ silu(z))

as in mamba_ssm's `Mamba` module (`x_proj` kept as the three maps W_r, W_B, W_C; `in_proj` as
W_x and W_z). A = −exp(A_log) with the S4D-real init A_{c,n} = −(n + 1); dt_bias is
softplus⁻¹ of a log-uniform dt in [dt_min, dt_max]. The scan is
`hybrid_jax.ops.selective_scan` with one head of E channels and one group of B/C.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import Mamba1Cache
from hybrid_jax.config import ModelConfig, check_finite_options
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, output_std
from hybrid_jax.nn.layers import Linear, ShortConv, dt_bias_init, param, symmetric_uniform
from hybrid_jax.ops import context_parallel
from hybrid_jax.ops.selective_scan import selective_scan, selective_scan_step


@dataclasses.dataclass(frozen=True)
class Mamba1Options:
    """Options of a Mamba-1 layer (`state_size` is N, `dt_rank` None: ⌈d_model / 16⌉)."""

    expand: int = 2  # E = expand · d_model
    state_size: int = 16
    conv_size: int = 4
    dt_rank: int | None = None
    chunk_size: int = 64  # of the chunked scan
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    implementation: str | None = None  # of hybrid_jax.ops.selective_scan
    conv_implementation: str | None = None  # of hybrid_jax.ops.short_conv ("xla", "pallas")

    def __post_init__(self) -> None:
        for name in ("expand", "state_size", "conv_size", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Mamba1Options.{name}={value!r}: expected a positive integer")
        if self.dt_rank is not None and (not isinstance(self.dt_rank, int) or self.dt_rank < 1):
            raise ValueError(f"Mamba1Options.dt_rank={self.dt_rank!r}: expected a positive "
                             "integer or None")
        check_finite_options("Mamba1Options", self, ("dt_min", "dt_max", "dt_init_floor"))
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"Mamba1Options: expected 0 < dt_min <= dt_max, got "
                             f"dt_min={self.dt_min}, dt_max={self.dt_max}")

    def rank(self, model: ModelConfig) -> int:
        return self.dt_rank or math.ceil(model.d_model / 16)


def _a_log_init(key, shape, dtype):
    del key  # S4D-real: A_{c,n} = −(n + 1) for every channel
    return jnp.broadcast_to(jnp.log(jnp.arange(1, shape[-1] + 1, dtype=jnp.float32)),
                            shape).astype(dtype)


@register_mixer_block("mamba1", Mamba1Options,
                      "Mamba-1 (selective scan) mixer (ffn_dim=0: Mamba's FFN-free blocks)")
class Mamba1Mixer(nnx.Module):
    """The Mamba-1 mixer; decoding keeps a `Mamba1Cache` (conv inputs and the `[B, 1, E, N]`
    float32 scan state), so its memory does not grow with the sequence.

    Parts: `x_proj`/`conv`, `z_proj`, `scan_inputs` (dt, B, C), the op `selective_scan` and
    `output(y, x, z)`.
    """

    deepnorm_scaled = ("x_proj", "out_proj")

    def __init__(self, config: ModelConfig, options: Mamba1Options, *, rngs: nnx.Rngs):
        self.channels = e = options.expand * config.d_model
        self.state_size = n = options.state_size
        self.chunk_size, self.implementation = options.chunk_size, options.implementation
        self.dtype = compute_dtype(config)
        d, r, kw = config.d_model, options.rank(config), dense_kwargs(config, rngs)
        pdtype = kw["param_dtype"]
        self.x_proj = Linear(d, e, axes=("embed", "mlp"), **kw)
        self.z_proj = Linear(d, e, axes=("embed", "mlp"), **kw)
        self.conv = ShortConv(e, options.conv_size, axis="mlp", rngs=rngs, use_bias=True,
                              dtype=self.dtype, param_dtype=pdtype,
                              implementation=options.conv_implementation)
        self.dt_low = Linear(e, r, axes=("mlp", None), **kw)
        self.b_proj = Linear(e, n, axes=("mlp", "state"), **kw)
        self.c_proj = Linear(e, n, axes=("mlp", "state"), **kw)
        self.dt_proj = param(rngs, symmetric_uniform(r ** -0.5), (r, e), pdtype, (None, "mlp"))
        dt_init = dt_bias_init(options.dt_min, options.dt_max, options.dt_init_floor)
        self.dt_bias = param(rngs, dt_init, e, jnp.float32, ("mlp",))
        self.A_log = param(rngs, _a_log_init, (e, n), jnp.float32, ("mlp", "state"))
        self.D = param(rngs, nnx.initializers.ones, e, jnp.float32, ("mlp",))
        self.out_proj = Linear(e, d, axes=("mlp", "embed"), **{**kw, "std": output_std(config)})

    def _A(self) -> jax.Array:
        return -jnp.exp(self.A_log[...])

    def scan_inputs(self, x_conv_BTE: jax.Array):
        """`(dt [B,T,E] float32, B [B,T,N], C [B,T,N])` from the convolved channels."""
        dt_low = self.dt_low(x_conv_BTE).astype(jnp.float32)
        dt = jax.nn.softplus(dt_low @ self.dt_proj[...].astype(jnp.float32) + self.dt_bias[...])
        return dt, self.b_proj(x_conv_BTE), self.c_proj(x_conv_BTE)

    def output(self, y_BTE: jax.Array, x_BTE: jax.Array, z_BTE: jax.Array) -> jax.Array:
        y = y_BTE.astype(jnp.float32) + self.D[...] * x_BTE.astype(jnp.float32)
        return self.out_proj((y * jax.nn.silu(z_BTE.astype(jnp.float32))).astype(self.dtype))

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        x = self.conv(self.x_proj(x_BTD), ctx.segment_ids)
        z = self.z_proj(x_BTD)
        dt, B, C = self.scan_inputs(x)
        y = context_parallel.selective_scan(
            x[:, :, None], dt[:, :, None], self._A()[None], B[:, :, None], C[:, :, None],
            chunk_size=self.chunk_size, segment_ids=ctx.segment_ids,
            implementation=self.implementation)[:, :, 0]
        return self.output(y, x, z)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> Mamba1Cache:
        del max_len  # the state has a fixed size
        return Mamba1Cache(conv=self.conv.init_cache(batch, self.channels, dtype),
                           ssm=jnp.zeros((batch, 1, self.channels, self.state_size),
                                         jnp.float32))

    def decode(self, x_BTD: jax.Array, cache: Mamba1Cache, ctx: TokenContext
               ) -> tuple[jax.Array, Mamba1Cache]:
        """Continues from `cache`: one token with the scan step, a prefill with the scan."""
        del ctx
        x, conv_cache = self.conv.decode(self.x_proj(x_BTD), cache.conv)
        z = self.z_proj(x_BTD)
        dt, B, C = self.scan_inputs(x)
        A = self._A()[None]
        if x_BTD.shape[1] == 1:
            y, state = selective_scan_step(cache.ssm, x[:, 0, None], dt[:, 0, None], A,
                                           B[:, 0, None], C[:, 0, None])
            y = y[:, None, 0]
        else:
            y, state = selective_scan(x[:, :, None], dt[:, :, None], A, B[:, :, None],
                                      C[:, :, None], chunk_size=self.chunk_size,
                                      initial_state=cache.ssm, return_final_state=True,
                                      implementation=self.implementation)
            y = y[:, :, 0]
        new_cache = Mamba1Cache(conv=conv_cache, ssm=state.astype(cache.ssm.dtype))
        return self.output(y, x, z), new_cache

