"""Feed-forward branches: SwiGLU ("ffn") and the Dual-FFN of PHA ("dual_ffn").

They are mixers like any other (`Mixer` protocol, no decode state), so a block can place them
in sequence after a mixer or in parallel with mixers. DeepNorm's β scales their up and down
projections (`deepnorm_scaled`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from hybrid_jax.config import ModelConfig
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.common import compute_dtype, output_std, param_dtype
from hybrid_jax.nn.layers import SwiGLU
from hybrid_jax.registry import register_mixer


def _check_width(owner: str, name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{owner}.{name}={value!r}: expected a positive integer or None")


@dataclasses.dataclass(frozen=True)
class FFNOptions:
    """Width of a SwiGLU branch; None: the model's `ffn_dim` (8/3·d_model rounded up to 32)."""

    ffn_dim: int | None = None

    def __post_init__(self) -> None:
        _check_width("FFNOptions", "ffn_dim", self.ffn_dim)

    def check(self, model: ModelConfig) -> None:
        if self.width(model) < 1:
            raise ValueError("an 'ffn' branch needs ffn_dim >= 1 (the model's ffn_dim is 0)")

    def width(self, model: ModelConfig) -> int:
        return model.resolved_ffn_dim if self.ffn_dim is None else self.ffn_dim


def _swiglu_kwargs(config: ModelConfig, rngs: nnx.Rngs) -> dict[str, Any]:
    return dict(rngs=rngs, std=config.init_std, out_std=output_std(config),
                dtype=compute_dtype(config), param_dtype=param_dtype(config))


class _Stateless:
    """Decode of a position-wise branch: the parallel call, no cache."""

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> None:
        return None

    def decode(self, x_BTD: jax.Array, cache: None, ctx: TokenContext):
        return self(x_BTD, ctx), None


@register_mixer("ffn", FFNOptions, "SwiGLU feed-forward W_down(silu(W_gate x) ⊙ W_up x)")
class FFN(_Stateless, SwiGLU):
    """A SwiGLU branch (the FFN sublayer of the standard blocks)."""

    deepnorm_scaled = ("up", "down")

    def __init__(self, config: ModelConfig, options: FFNOptions, *, rngs: nnx.Rngs):
        options.check(config)
        SwiGLU.__init__(self, config.d_model, options.width(config),
                        **_swiglu_kwargs(config, rngs))

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext | None = None) -> jax.Array:
        return SwiGLU.__call__(self, x_BTD)


@dataclasses.dataclass(frozen=True)
class DualFFNOptions:
    """Dual-FFN widths: the primary arm (None: the model's `ffn_dim`) and the auxiliary arm
    (None: a quarter of the primary; the PHA paper gives no width, a quarter keeps the extra
    cost small while still a separate path)."""

    ffn_dim: int | None = None
    aux_ffn_dim: int | None = None

    def __post_init__(self) -> None:
        _check_width("DualFFNOptions", "ffn_dim", self.ffn_dim)
        _check_width("DualFFNOptions", "aux_ffn_dim", self.aux_ffn_dim)

    def widths(self, model: ModelConfig) -> tuple[int, int]:
        primary = model.resolved_ffn_dim if self.ffn_dim is None else self.ffn_dim
        return primary, max(primary // 4, 1) if self.aux_ffn_dim is None else self.aux_ffn_dim

    def check(self, model: ModelConfig) -> None:
        if self.widths(model)[0] < 1:
            raise ValueError("a 'dual_ffn' branch needs ffn_dim >= 1 (the model's ffn_dim is 0)")


@register_mixer("dual_ffn", DualFFNOptions,
                "PHA's Dual-FFN: a primary SwiGLU arm plus a smaller auxiliary arm, summed")
class DualFFN(_Stateless, nnx.Module):
    """`primary(x) + aux(x)`, two SwiGLUs of widths `DualFFNOptions.widths`."""

    deepnorm_scaled = ("primary.up", "primary.down", "aux.up", "aux.down")

    def __init__(self, config: ModelConfig, options: DualFFNOptions, *, rngs: nnx.Rngs):
        options.check(config)
        primary, aux = options.widths(config)
        self.primary = SwiGLU(config.d_model, primary, **_swiglu_kwargs(config, rngs))
        self.aux = SwiGLU(config.d_model, aux, **_swiglu_kwargs(config, rngs))

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext | None = None) -> jax.Array:
        return self.primary(x_BTD) + self.aux(x_BTD)
