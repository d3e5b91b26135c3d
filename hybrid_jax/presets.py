"""Named model configurations. `names()` lists them; `get(name)` returns a `ModelConfig`.

Tiny presets (name contains "tiny") train in minutes on a CPU; the others are the paper-scale
shapes. Each block type adds at least one tiny preset.
"""

from __future__ import annotations

from collections.abc import Callable

from hybrid_jax.config import ModelConfig, layer

_PRESETS: dict[str, Callable[[], ModelConfig]] = {}
_DESCRIPTIONS: dict[str, str] = {}


def register(name: str, description: str = "") -> Callable:
    """Decorator registering a zero-argument function that returns a ModelConfig."""

    def decorate(fn: Callable[[], ModelConfig]) -> Callable[[], ModelConfig]:
        if name in _PRESETS:
            raise ValueError(f"preset {name!r} is already registered")
        _PRESETS[name] = fn
        _DESCRIPTIONS[name] = description or (fn.__doc__ or "").strip().splitlines()[0]
        return fn

    return decorate


def names() -> list[str]:
    return sorted(_PRESETS)


def describe(name: str) -> str:
    get(name)
    return _DESCRIPTIONS[name]


def get(name: str) -> ModelConfig:
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; available presets: {names()}")
    return _PRESETS[name]()


@register("transformer-125m")
def transformer_125m() -> ModelConfig:
    """GPT-2-small shape: 12 layers, d_model 768, 12 heads, tied embeddings (~124M params)."""
    return ModelConfig(layers=("attention",) * 12, vocab_size=50304, d_model=768, num_heads=12,
                       ffn_dim=2048)


@register("transformer-tiny")
def transformer_tiny() -> ModelConfig:
    """2-layer, d_model 64 transformer on a byte vocabulary, for CPU runs and tests."""
    return ModelConfig(layers=("attention",) * 2, vocab_size=256, d_model=64, num_heads=4)


@register("swa-transformer-tiny")
def swa_transformer_tiny() -> ModelConfig:
    """transformer-tiny with 16-token sliding-window attention and grouped-query heads."""
    return ModelConfig(layers=("attention",) * 2, vocab_size=256, d_model=64, num_heads=4,
                       num_kv_heads=2, window=16)


# Mamba-2 layers of the tiny presets: 8 heads of 16 channels (d_inner 128), state size 16.
_MAMBA2_TINY = layer("mamba2", ssm_head_dim=16, state_size=16)


@register("mamba2-tiny")
def mamba2_tiny() -> ModelConfig:
    """4 Mamba-2 layers, d_model 64, no FFN (as in Mamba-2), for CPU runs and tests."""
    return ModelConfig(layers=(_MAMBA2_TINY,) * 4, vocab_size=256, d_model=64, ffn_dim=0)


@register("mamba2-hybrid-tiny")
def mamba2_hybrid_tiny() -> ModelConfig:
    """Mamba-2 then attention (each with a SwiGLU FFN), d_model 64: a tiny hybrid."""
    return ModelConfig(layers=(_MAMBA2_TINY, "attention"), vocab_size=256, d_model=64,
                       num_heads=4)


@register("mamba2-130m")
def mamba2_130m() -> ModelConfig:
    """Mamba-2 130M: 24 layers, d_model 768, expand 2, head dim 64, state 128 (~129M params).

    Like Mamba-2 it has no FFN (`ffn_dim=0`): each block is norm → mixer → residual.
    """
    return ModelConfig(layers=(layer("mamba2", ssm_head_dim=64, state_size=128),) * 24,
                       vocab_size=50304, d_model=768, ffn_dim=0)


@register("gss-tiny")
def gss_tiny() -> ModelConfig:
    """2 GSS layers, d_model 64 (gate width 256, DSS width 16, 32 modes), no FFN as in GSS."""
    return ModelConfig(layers=(layer("gss", state_size=32),) * 2, vocab_size=256, d_model=64,
                       ffn_dim=0)


@register("gdn-tiny")
def gdn_tiny() -> ModelConfig:
    """2 Gated DeltaNet layers, d_model 64, 4 heads (key 16, value 32), for CPU runs and tests."""
    return ModelConfig(layers=("gdn",) * 2, vocab_size=256, d_model=64, num_heads=4)


@register("gdn-hybrid-tiny")
def gdn_hybrid_tiny() -> ModelConfig:
    """Gated DeltaNet then attention (each with a SwiGLU FFN), d_model 64: a tiny hybrid."""
    return ModelConfig(layers=("gdn", "attention"), vocab_size=256, d_model=64, num_heads=4)


@register("gdn-340m")
def gdn_340m() -> ModelConfig:
    """Gated DeltaNet ~347M: 21 layers, d_model 1024, 3 heads of 256 (values 512), FFN 2816.

    Layers, width, head size 256, expand_v 2 and the FFN width (fla's hidden_ratio 4) follow
    flame's `gated_deltanet_340M.json`; 3 heads instead of its 6 keep fla's budget of q/k
    0.75·d and v/gate/out 1.5·d (6·d² per mixer; 6 heads would make it ~460M). Tied
    embeddings and a 32000 vocabulary (Llama-2's) are our choice.
    """
    return ModelConfig(layers=("gdn",) * 21, vocab_size=32000, d_model=1024, num_heads=3,
                       head_dim=256, ffn_dim=2816)


@register("gsa-tiny")
def gsa_tiny() -> ModelConfig:
    """2 Gated Slot Attention layers, d_model 64, 4 heads of 16 with 16 slots each."""
    return ModelConfig(layers=(layer("gsa", num_slots=16),) * 2, vocab_size=256, d_model=64,
                       num_heads=4)


@register("gsa-hybrid-tiny")
def gsa_hybrid_tiny() -> ModelConfig:
    """Gated Slot Attention (16 slots) then attention, d_model 64: a tiny hybrid."""
    return ModelConfig(layers=(layer("gsa", num_slots=16), "attention"), vocab_size=256,
                       d_model=64, num_heads=4)
