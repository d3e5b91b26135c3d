"""Typed decode state: one small pytree per mixer, and the model's cache around them.

Running a prompt through `LanguageModel.decode` token by token with these caches gives the same
logits as the parallel forward pass. Sliding-window attention keeps a ring buffer of `window`
entries, not `max_len`.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class AttentionCache:
    """Keys/values of the last `L` positions (`L = window`, or `max_len` for full attention).

    Position p lives in slot `p % L`; `positions[slot]` is the position held there, −1 if empty.
    """

    keys: jax.Array  # [B, L, Hkv, D]
    values: jax.Array  # [B, L, Hkv, Dv]
    positions: jax.Array  # [L] int32


@struct.dataclass
class ConvCache:
    """The last `size − 1` inputs of a short causal convolution."""

    inputs: jax.Array  # [B, size - 1, C]


@struct.dataclass
class Mamba1Cache:
    """Mamba-1 decode state: the short conv's last inputs and the selective-scan state."""

    conv: ConvCache  # [B, conv_size - 1, E]
    ssm: jax.Array  # [B, 1, E, N] float32


@struct.dataclass
class Mamba2Cache:
    """Mamba-2 decode state: the short convs' last inputs and the SSM state."""

    x_conv: ConvCache  # [B, conv_size - 1, H·P]
    bc_conv: ConvCache  # [B, conv_size - 1, 2·G·N]
    ssm: jax.Array  # [B, H, P, N] float32


@struct.dataclass
class GSSCache:
    """GSS decode state: the diagonal state space's complex state."""

    dss: jax.Array  # [B, H, N] complex64


@struct.dataclass
class GatedDeltaNetCache:
    """Gated DeltaNet decode state: the q/k/v short convs' last inputs (None without short
    convs) and the delta-rule state."""

    q_conv: ConvCache | None  # [B, conv_size - 1, H·K]
    k_conv: ConvCache | None  # [B, conv_size - 1, H·K]
    v_conv: ConvCache | None  # [B, conv_size - 1, H·V]
    state: jax.Array  # [B, H, K, V] float32


@struct.dataclass
class GSACache:
    """Gated Slot Attention decode state: slot keys K̃ and slot values Ṽ of every head."""

    slot_keys: jax.Array  # [B, H, K, M] float32
    slot_values: jax.Array  # [B, H, M, V] float32


@struct.dataclass
class NHACache:
    """Native Hybrid Attention decode state: the op's `NHAState` (slots in float32, a ring
    buffer of the last `window` tokens' inputs that enter the slots as they leave it, the
    length) and the q/k/v short convs' last inputs (None without short convs)."""

    state: Any  # hybrid_jax.ops.nha.NHAState
    q_conv: ConvCache | None  # [B, conv_size - 1, H·K]
    k_conv: ConvCache | None  # [B, conv_size - 1, G·K]
    v_conv: ConvCache | None  # [B, conv_size - 1, G·K]


@struct.dataclass
class BlockCache:
    """A block's decode state: one cache per branch, in branch order (None for stateless
    branches such as FFNs)."""

    branches: tuple[Any, ...]


@struct.dataclass
class LMCache:
    """A language model's decode state: the next position and one cache per layer."""

    index: jax.Array  # [] int32: number of tokens consumed so far
    layers: tuple[Any, ...]
