"""Mamba-2 (Dao & Gu, 2024): a selective state-space mixer computed with the SSD algorithm.

Per token, with `d_inner = expand·d_model` split into `H = d_inner / P` heads of size P:

    z, x, B, C, dt_raw = projections of the input     (x: [H, P], B, C: [G, N], dt_raw: [H])
    x, B, C = silu(causal depthwise conv_4(x, B, C))
    dt = softplus(dt_raw + dt_bias),  A = −exp(A_log)
    S_t = exp(dt·A)·S_{t−1} + dt·x_t B_tᵀ,  y_t = S_t C_t + D·x_t       (state [H, P, N])
    out = W_out · RMSNorm_G(y ⊙ silu(z))            (RMSNorm over each of the G groups)

as in mamba_ssm's `Mamba2Simple` and fla's `Mamba2` layer. The fused `in_proj` of the references
is kept as five projections (z, x, B, C, dt) — the same map, with head-shaped outputs that
shard along heads — and the depthwise conv over `[x; B; C]` as one conv on each (depthwise:
the same map), so that Oryx can share B (its keys) and x (its values) without C.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import Mamba2Cache
from hybrid_jax.config import ModelConfig, check_finite_options
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, output_std
from hybrid_jax.nn.layers import GatedRMSNorm, Linear, ShortConv, dt_bias_init, param, run_convs
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
    # False: attention-compatible parts (an attention layer converted to Oryx, convert/oryx.py)
    conv_activation: bool = True  # SiLU after the short convs
    gated_norm: bool = True  # out = W_out·RMSNorm_G(y ⊙ silu(z)); False: W_out·y (no z)
    implementation: str | None = None  # of hybrid_jax.ops.ssd.ssd
    conv_implementation: str | None = None  # of hybrid_jax.ops.short_conv ("xla", "pallas")

    def __post_init__(self) -> None:
        for name in ("expand", "ssm_head_dim", "state_size", "n_groups", "conv_size",
                     "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Mamba2Options.{name}={value!r}: expected a positive integer")
        check_finite_options("Mamba2Options", self, ("dt_min", "dt_max", "dt_init_floor",
                                                     "a_init_min", "a_init_max"))
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

    Parts (shared with attention by Oryx, `nn/oryx.py`): `features(x)` (x, dt, B, C after the
    short convs), `recurrence(x, dt, B, C)` (the SSD op and the D skip) and `output(y, x)`
    (gated norm with `z_proj`, `out_proj`). In attention terms (SSD's duality) C is the query,
    B the key and x the value, with one query/key head per group of H/G value heads.
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
        self.z_proj = (Linear(d, (h, p), axes=("embed", "heads", "head_dim"), **kw)
                       if options.gated_norm else None)
        self.x_proj = Linear(d, (h, p), axes=("embed", "heads", "head_dim"), **kw)
        self.b_proj = Linear(d, (g, n), axes=("embed", None, "state"), **kw)
        self.c_proj = Linear(d, (g, n), axes=("embed", None, "state"), **kw)
        self.dt_proj = Linear(d, h, axes=("embed", "heads"), **kw)
        conv_kw = dict(rngs=rngs, use_bias=True, activation=options.conv_activation,
                       dtype=self.dtype, param_dtype=pdtype,
                       implementation=options.conv_implementation)
        self.x_conv = ShortConv(h * p, options.conv_size, axis="heads", **conv_kw)
        self.b_conv = ShortConv(g * n, options.conv_size, **conv_kw)
        self.c_conv = ShortConv(g * n, options.conv_size, **conv_kw)
        dt_init = dt_bias_init(options.dt_min, options.dt_max, options.dt_init_floor)
        self.dt_bias = param(rngs, dt_init, h, jnp.float32, ("heads",))
        self.A_log = param(rngs, _a_log_init(options), h, jnp.float32, ("heads",))
        self.D = param(rngs, nnx.initializers.ones, h, jnp.float32, ("heads",))
        self.norm = (GatedRMSNorm(h * p, group_size=h * p // g, norm_before_gate=False,
                                  eps=config.norm_eps, dtype=self.dtype, param_dtype=pdtype)
                     if options.gated_norm else None)
        self.out_proj = Linear((h, p), d, axes=("heads", "head_dim", "embed"),
                               **{**kw, "std": output_std(config)})

    @property
    def _convs(self) -> tuple[ShortConv, ShortConv, ShortConv]:
        return self.x_conv, self.b_conv, self.c_conv

    def features(self, x_BTD: jax.Array, segment_ids: jax.Array | None = None,
                 conv_caches: list | None = None):
        """x `[B,T,H,P]`, dt `[B,T,H]` (float32), B, C `[B,T,G,N]` after the short convs, and
        the convs' new caches (with `conv_caches`, decoding continues them; else
        `segment_ids` reset the convs at document starts)."""
        batch, T = x_BTD.shape[:2]
        raw = [proj(x_BTD).reshape(batch, T, -1) for proj in (self.x_proj, self.b_proj,
                                                               self.c_proj)]
        (x, B, C), conv_caches = run_convs(self._convs, raw, segment_ids, conv_caches)
        x = constrain(x.reshape(batch, T, self.heads, self.head_dim),
                      ("batch", "seq", "heads", "head_dim"))
        B, C = (y.reshape(batch, T, self.groups, self.state_size) for y in (B, C))
        dt = jax.nn.softplus(self.dt_proj(x_BTD).astype(jnp.float32) + self.dt_bias[...])
        return x, dt, B, C, conv_caches

    def recurrence(self, x, dt, B, C, *, segment_ids: jax.Array | None = None,
                   state: jax.Array | None = None):
        """The SSD plus the D skip, `y [B,T,H,P]` in x's (the compute) dtype, and with `state`
        (decoding: one token with the step, more chunked) the new state, else None.

        The op adds the skip (`ssd(D=)`): y is summed in float32 and rounded once, as
        mamba_ssm's kernels return it (the gated norm takes it to float32 again, and a float32
        y kept for the norm's backward cost 6 KB a token and layer at mamba2-130m, of 25.4);
        the GPU kernel that writes y adds it, saving an XLA pass over y and x."""
        A, D = -jnp.exp(self.A_log[...]), self.D[...]
        if state is None:  # training / eval: the context-parallel form when the mesh has one
            y = context_parallel.ssd(x, dt, A, B, C, chunk_size=self.chunk_size,
                                     segment_ids=segment_ids, D=D,
                                     implementation=self.implementation)
        elif x.shape[1] == 1:
            y, state = ssd_step(state, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D)
            y = y[:, None]
        else:
            y, state = ssd(x, dt, A, B, C, chunk_size=self.chunk_size, initial_state=state,
                           return_final_state=True, D=D, implementation=self.implementation)
        return y, state

    def output(self, y_BTHP: jax.Array, x_BTD: jax.Array) -> jax.Array:
        """`out_proj(RMSNorm_G(y ⊙ silu(z)))` with z = `z_proj(x_BTD)` (`out_proj(y)` without
        the gated norm)."""
        if self.norm is None:
            return self.out_proj(y_BTHP)
        z = constrain(self.z_proj(x_BTD), ("batch", "seq", "heads", "head_dim"))
        batch, T = z.shape[:2]
        y = self.norm(y_BTHP.reshape(batch, T, -1), z.reshape(batch, T, -1))
        return self.out_proj(y.reshape(z.shape))

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        *features, _ = self.features(x_BTD, ctx.segment_ids)
        y, _ = self.recurrence(*features, segment_ids=ctx.segment_ids)
        return self.output(y, x_BTD)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> Mamba2Cache:
        del max_len  # the state has a fixed size
        widths = (self.heads * self.head_dim,) + (self.groups * self.state_size,) * 2
        convs = [conv.init_cache(batch, width, dtype)
                 for conv, width in zip(self._convs, widths, strict=True)]
        return Mamba2Cache(*convs, state=jnp.zeros(
            (batch, self.heads, self.head_dim, self.state_size), jnp.float32))

    def decode(self, x_BTD: jax.Array, cache: Mamba2Cache, ctx: TokenContext
               ) -> tuple[jax.Array, Mamba2Cache]:
        """Continues from `cache`: one token with `ssd_step`, a prefill with the chunked SSD."""
        del ctx
        *features, convs = self.features(x_BTD, conv_caches=cache.convs)
        y, state = self.recurrence(*features, state=cache.state)
        new_cache = Mamba2Cache(*convs, state=state.astype(cache.state.dtype))
        return self.output(y, x_BTD), new_cache
