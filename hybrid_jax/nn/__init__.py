"""Flax NNX modules: parameters and projections around the ops. Importing this package
registers the built-in mixers and block types."""

from hybrid_jax.nn import (
    attention,  # noqa: F401  (registers "attention")
    pha,  # noqa: F401  (registers "pha")
)
from hybrid_jax.nn.attention import AttentionMixer, AttentionOptions
from hybrid_jax.nn.blocks import Block, BlockOptions, register_mixer_block
from hybrid_jax.nn.ffn import FFN, DualFFN, DualFFNOptions, FFNOptions
from hybrid_jax.nn.gated_deltanet import (  # registers "gdn"
    GatedDeltaNetMixer,
    GatedDeltaNetOptions,
)
from hybrid_jax.nn.gsa import GSAMixer, GSAOptions  # registers "gsa"
from hybrid_jax.nn.gss import GSSMixer, GSSOptions  # registers "gss"
from hybrid_jax.nn.layers import (
    Embedding,
    GatedRMSNorm,
    Linear,
    RMSNorm,
    RoPE,
    ShortConv,
    SwiGLU,
)
from hybrid_jax.nn.lm import LanguageModel, count_params, create_model
from hybrid_jax.nn.mamba1 import Mamba1Mixer, Mamba1Options  # registers "mamba1"
from hybrid_jax.nn.mamba2 import Mamba2Mixer, Mamba2Options  # registers "mamba2"
from hybrid_jax.nn.nha import NHAMixer, NHAOptions  # registers "nha"
from hybrid_jax.nn.oryx import OryxMixer, OryxOptions  # registers "oryx"

__all__ = [
    "AttentionMixer",
    "AttentionOptions",
    "Block",
    "BlockOptions",
    "DualFFN",
    "DualFFNOptions",
    "FFN",
    "FFNOptions",
    "Embedding",
    "GSAMixer",
    "GSAOptions",
    "GSSMixer",
    "GSSOptions",
    "GatedDeltaNetMixer",
    "GatedDeltaNetOptions",
    "GatedRMSNorm",
    "LanguageModel",
    "Linear",
    "Mamba1Mixer",
    "Mamba1Options",
    "Mamba2Mixer",
    "Mamba2Options",
    "NHAMixer",
    "NHAOptions",
    "OryxMixer",
    "OryxOptions",
    "RMSNorm",
    "RoPE",
    "ShortConv",
    "SwiGLU",
    "count_params",
    "create_model",
    "register_mixer_block",
]
