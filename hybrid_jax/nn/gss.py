"""Gated State Space layer (GSS; Mehta, Gupta, Cutkosky & Neyshabur, 2022, Fig. 1).

    v = gelu(W_v x)                    [F = expansion · d_model]   the gate
    u = norm(gelu(W_u x))              [H = ssm_dim, reduced]      the DSS input
    y = DSS(u) + D ⊙ u                 per channel, N complex modes shared by all channels
    out = W_o((W_uc y) ⊙ v)

The paper uses d_model E = 1024, F = 4096, H = 256, N = 512 (the defaults here scale the same
way: `expansion=4`, `ssm_dim=d_model/4`) and stacks GSS layers without a separate FFN.

The DSS is DSS-exp (`hybrid_jax.ops.dss`) with the GSS pseudocode's parameterisation
`λ = −exp(Λ_re) + i·exp(Λ_im)` (one Λ of N modes shared by the channels) and a learned step
`Δ_h = exp(log_dt_h)` per channel, initialised as in DSS-exp: Λ from the Skew-HiPPO matrix
(real part −½, imaginary parts its positive eigenvalues), `log Δ ~ U[log dt_min, log dt_max]`,
W ~ CN(0, 1), D ~ N(0, 1). The DSS input norm is an RMSNorm (LayerNorm in the paper).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.cache import GSSCache
from hybrid_jax.config import ModelConfig, check_finite_options
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import compute_dtype, dense_kwargs, norm, output_std
from hybrid_jax.nn.layers import Linear, gated_down, param
from hybrid_jax.ops import context_parallel
from hybrid_jax.ops.dss import dss, dss_discretize, dss_step


@dataclasses.dataclass(frozen=True)
class GSSOptions:
    """Options of a GSS layer."""

    expansion: int = 4  # F = expansion · d_model (width of the gate v)
    ssm_dim: int | None = None  # H, channels of the DSS; None: d_model // 4
    state_size: int = 512  # N complex modes
    dt_min: float = 0.001  # log Δ init: U[log dt_min, log dt_max]
    dt_max: float = 0.1
    chunk_size: int = 64  # of the chunked rung of hybrid_jax.ops.dss.dss
    implementation: str | None = None  # of hybrid_jax.ops.dss.dss

    def __post_init__(self) -> None:
        for name in ("expansion", "state_size", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GSSOptions.{name}={value!r}: expected a positive integer")
        if self.ssm_dim is not None and (not isinstance(self.ssm_dim, int) or self.ssm_dim < 1):
            raise ValueError(f"GSSOptions.ssm_dim={self.ssm_dim!r}: expected a positive integer "
                             "or None (d_model // 4)")
        check_finite_options("GSSOptions", self, ("dt_min", "dt_max"))
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"GSSOptions: expected 0 < dt_min <= dt_max, got "
                             f"dt_min={self.dt_min}, dt_max={self.dt_max}")

    def resolved_ssm_dim(self, model: ModelConfig) -> int:
        return model.d_model // 4 if self.ssm_dim is None else self.ssm_dim

    def check(self, model: ModelConfig) -> None:
        if self.resolved_ssm_dim(model) < 1:
            raise ValueError(f"ssm_dim=None means d_model // 4, which is 0 for d_model="
                             f"{model.d_model}; set ssm_dim")


@functools.lru_cache(maxsize=8)
def skew_hippo_imag(num_modes: int) -> np.ndarray:
    """The `num_modes` positive imaginary parts (ascending) of the eigenvalues of the normal part
    of the HiPPO-LegS matrix of size 2·num_modes, `−½·I + S` (DSS's Skew-HiPPO initialisation).

    S is skew-symmetric with `S_nk = ½·sign(k − n)·√((2n+1)(2k+1))`; `i·S` is Hermitian, so its
    real eigenvalues ω give S's eigenvalues ±iω.
    """
    n = np.arange(2 * num_modes)
    root = np.sqrt(2 * n + 1.0)
    skew = 0.5 * np.sign(n[None, :] - n[:, None]) * np.outer(root, root)
    omega = np.linalg.eigvalsh(1j * skew)  # ascending, ± pairs
    return omega[num_modes:]


def _constant_init(values: np.ndarray):
    return lambda key, shape, dtype: jnp.broadcast_to(jnp.asarray(values, dtype), shape)


def _log_uniform_init(low: float, high: float):
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, math.log(low),
                                                        math.log(high))


@register_mixer_block("gss", GSSOptions,
                      "Gated State Space (GELU gates, DSS on a reduced width)")
class GSSMixer(nnx.Module):
    """The GSS mixer; decoding keeps a `GSSCache` (the `[B, H, N]` complex DSS state).
    Parts: `inputs(x)` (u, gate), `discretize()`, the op `dss`, `output(y, u, gate)`."""

    deepnorm_scaled = ("u_proj", "uc_proj", "out_proj")

    def __init__(self, config: ModelConfig, options: GSSOptions, *, rngs: nnx.Rngs):
        options.check(config)
        d = config.d_model
        f, h, n = options.expansion * d, options.resolved_ssm_dim(config), options.state_size
        self.implementation, self.chunk_size = options.implementation, options.chunk_size
        self.dtype = compute_dtype(config)
        kw = dense_kwargs(config, rngs)
        self.v_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.u_proj = Linear(d, h, axes=("embed", "heads"), **kw)
        self.ssm_norm = norm(config, h)
        self.lambda_log_neg_re = param(rngs, _constant_init(np.log(0.5)), n, jnp.float32,
                                       ("state",))
        self.lambda_log_im = param(rngs, _constant_init(np.log(skew_hippo_imag(n))), n,
                                   jnp.float32, ("state",))
        self.log_dt = param(rngs, _log_uniform_init(options.dt_min, options.dt_max), h,
                            jnp.float32, ("heads",))
        complex_normal = nnx.initializers.normal(math.sqrt(0.5))  # W ~ CN(0, 1)
        self.w_re = param(rngs, complex_normal, (h, n), jnp.float32, ("heads", "state"))
        self.w_im = param(rngs, complex_normal, (h, n), jnp.float32, ("heads", "state"))
        self.D = param(rngs, nnx.initializers.normal(1.0), h, jnp.float32, ("heads",))
        self.uc_proj = Linear(h, f, axes=("heads", "mlp"), **kw)
        self.out_proj = Linear(f, d, axes=("mlp", "embed"), **{**kw, "std": output_std(config)})

    def discretize(self) -> tuple[jax.Array, jax.Array]:
        """`(log_decay, coeff)`, complex `[H, N]`, of `hybrid_jax.ops.dss`."""
        return dss_discretize(self.log_dt[...], self.lambda_log_neg_re[...],
                              jnp.exp(self.lambda_log_im[...]), self.w_re[...], self.w_im[...])

    def inputs(self, x_BTD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The DSS input u `[B, T, H]` and the gate's pre-activation `W_v x` `[B, T, F]` (v =
        gelu of it, applied in `output`). Only `W_u x` is kept for the backward pass: GELU's
        terms and the norm are recomputed from it."""
        u = jax.checkpoint(lambda pre: self.ssm_norm(jax.nn.gelu(pre)))(self.u_proj(x_BTD))
        return u, self.v_proj(x_BTD)

    def output(self, y_BTH: jax.Array, u_BTH: jax.Array, gate_BTF: jax.Array) -> jax.Array:
        """`W_o(W_uc(y + D ⊙ u) ⊙ gelu(gate))`, keeping the gate and W_uc's output (not v, GELU's
        terms or the product: `gated_down`) for the backward pass."""
        y = y_BTH.astype(jnp.float32) + self.D[...] * u_BTH.astype(jnp.float32)
        return gated_down(jax.nn.gelu, gate_BTF, self.uc_proj(y), self.out_proj)

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        u, gate = self.inputs(x_BTD)
        log_decay, coeff = self.discretize()
        y = context_parallel.dss(u, log_decay, coeff, segment_ids=ctx.segment_ids,
                                 chunk_size=self.chunk_size, implementation=self.implementation)
        return self.output(y, u, gate)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> GSSCache:
        del max_len, dtype  # the state has a fixed size and is complex
        h, n = self.w_re.shape
        return GSSCache(dss=jnp.zeros((batch, h, n), jnp.promote_types(self.w_re.dtype,
                                                                       jnp.complex64)))

    def decode(self, x_BTD: jax.Array, cache: GSSCache, ctx: TokenContext
               ) -> tuple[jax.Array, GSSCache]:
        """Continues from `cache`: one token with `dss_step`, a prefill with `dss`."""
        del ctx
        u, gate = self.inputs(x_BTD)
        log_decay, coeff = self.discretize()
        if x_BTD.shape[1] == 1:
            y, state = dss_step(cache.dss, u[:, 0], log_decay, coeff)
            y = y[:, None]
        else:
            y, state = dss(u, log_decay, coeff, initial_state=cache.dss, return_final_state=True,
                           chunk_size=self.chunk_size, implementation=self.implementation)
        return self.output(y, u, gate), GSSCache(dss=state.astype(cache.dss.dtype))

