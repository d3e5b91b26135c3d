"""Typed decode state: one small pytree per mixer, and the model's cache around them.

Running a prompt through `LanguageModel.decode` token by token with these caches gives the same
logits as the parallel forward pass. Sliding-window attention keeps a ring buffer of `window`
entries, not `max_len`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from flax import nnx, struct


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
class ConvHistory:
    """A short conv's inputs kept whole through a decode call (the previous `size − 1`, then
    the call's): `ShortConv.decode` of a `ConvHistory` returns one, from which the cache after
    any prefix of the call's tokens is cut (speculative decoding rolls back to one)."""

    inputs: jax.Array  # [B, size - 1 + T, C]


@struct.dataclass
class Mamba1Cache:
    """Mamba-1 decode state: the short conv's last inputs and the selective-scan state."""

    conv: ConvCache  # [B, conv_size - 1, E]
    ssm: jax.Array  # [B, 1, E, N] float32


@struct.dataclass
class Mamba2Cache:
    """Mamba-2 decode state: the short convs' last inputs and the SSM state."""

    x_conv: ConvCache  # [B, conv_size - 1, H·P]
    b_conv: ConvCache  # [B, conv_size - 1, G·N]
    c_conv: ConvCache  # [B, conv_size - 1, G·N]
    state: jax.Array  # [B, H, P, N] float32

    @property
    def convs(self) -> list[ConvCache]:
        """The convs' caches in the order of `Mamba2Mixer.features` (x, B, C)."""
        return [self.x_conv, self.b_conv, self.c_conv]


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

    @property
    def convs(self) -> list[ConvCache | None]:
        """The convs' caches in the order of `GatedDeltaNetMixer.features` (q, k, v)."""
        return [self.q_conv, self.k_conv, self.v_conv]


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
    """A language model's decode state: the next position and one cache per layer.

    `max_len` is the number of positions the cache was made for; decoding past it is an error
    unless `windowed` (then full-attention layers keep the last `max_len` tokens, a sliding
    window, and recurrent layers go on as usual). `batch`: the rows it was made for, which
    every decode call must feed.
    """

    index: jax.Array  # [] int32: number of tokens consumed so far
    layers: tuple[Any, ...]
    batch: int = struct.field(pytree_node=False)
    max_len: int = struct.field(pytree_node=False, default=0)
    windowed: bool = struct.field(pytree_node=False, default=False)


def check_token_ids(tokens: Any, vocab_size: int, what: str = "token") -> None:
    """Raises ValueError naming the first id outside `[0, vocab_size)` of a concrete array;
    traced arrays pass (the model embeds such ids as NaN, see `LanguageModel._embed`)."""
    if isinstance(tokens, jax.core.Tracer):
        return
    ids = np.asarray(tokens)
    bad = np.argwhere((ids < 0) | (ids >= vocab_size))
    if len(bad):
        where = tuple(int(i) for i in bad[0])
        raise ValueError(f"{what} id {ids[where]} at index {list(where)} is outside the "
                         f"vocabulary [0, {vocab_size}) (ModelConfig.vocab_size)"
                         + (f" ({len(bad)} ids in all)" if len(bad) > 1 else ""))


def check_cache_batch(cache: LMCache, batch: int) -> None:
    """Refuses tokens of another batch size than the cache's (each layer's state would fail
    on its own, naming an array of that layer)."""
    if batch != cache.batch:
        raise ValueError(f"decode: the tokens have batch {batch}, the cache was made for batch "
                         f"{cache.batch} (init_cache(batch={batch}, ...) for these)")


def check_cache_room(cache: LMCache, length: int) -> jax.Array | None:
    """Refuses to decode `length` more tokens past `cache.max_len` (unless `cache.windowed`).

    Returns None when nothing can overflow or the check was done here (concrete index), else a
    traced bool that is True when this call overflows (the caller turns its logits into NaN).
    """
    if cache.windowed or cache.max_len <= 0:
        return None
    end = cache.index + length
    if isinstance(end, jax.core.Tracer):
        return end > cache.max_len
    if int(end) > cache.max_len:
        raise ValueError(f"decoding {length} token(s) after {int(cache.index)} overflows the "
                         f"cache's max_len={cache.max_len}: make the cache with a larger "
                         "max_len, or init_cache(..., windowed=True) for a sliding window")
    return None


def check_cache_fresh(cache: LMCache) -> jax.Array | None:
    """Refuses a prefill (`decode(..., fresh_cache=True)`) into a cache that holds tokens.

    Returns None when the check was done here (concrete index), else a traced bool that is True
    when the cache is not fresh (the caller turns its logits into NaN).
    """
    if isinstance(cache.index, jax.core.Tracer):
        return cache.index != 0
    if int(cache.index) != 0:
        raise ValueError(f"decode(..., fresh_cache=True) needs a cache that holds nothing (from "
                         f"init_cache), got one after {int(cache.index)} token(s): pass "
                         "fresh_cache=False to continue it")
    return None


@struct.dataclass
class OryxCache:
    """Oryx decode state: BOTH the linear mixer's state and the KV cache, since every token
    writes its key/value into both whatever its mode (so the mode may change at any token)."""

    linear: Any  # GatedDeltaNetCache / Mamba2Cache (LinearSteps while recording steps)
    attention: AttentionCache


@struct.dataclass
class LinearSteps:
    """A linear mixer's decode state after each token of one decode call (`OryxCache.linear`
    under `TokenContext.record_steps`): every conv's inputs (`ConvHistory`) and the state after
    each token. `prefix(n)` is the mixer's cache after the call's first n tokens."""

    conv_inputs: list[jax.Array]  # [B, size - 1 + T, C] per conv, in the cache's order
    states: jax.Array  # [B, T, ...] float32
    cache_type: type = struct.field(pytree_node=False, default=None)

    def prefix(self, n: jax.Array) -> Any:
        """The cache (of `cache_type`) after the first `n` (traced, 1..T) tokens."""
        T = self.states.shape[1]
        convs = [ConvCache(jax.lax.dynamic_slice_in_dim(x, n, x.shape[1] - T, axis=1))
                 for x in self.conv_inputs]
        return self.cache_type(*convs, state=jax.lax.dynamic_index_in_dim(
            self.states, n - 1, axis=1, keepdims=False))


def cache_nbytes(cache: Any) -> int:
    """Bytes held by the arrays of a decode cache (any pytree of caches)."""
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(cache))


def decode_cache_bytes(model: Any, batch: int, max_len: int) -> dict[str, int]:
    """Bytes of `model.init_cache(batch, max_len)` (built abstractly): in all, in KV caches
    (attention, Oryx's attention mode) and in fixed-size recurrent states (the rest). A model
    with scanned layers (which cannot decode) is counted as its unscanned form, built
    abstractly too: the cache does not depend on how the layers are stored."""
    if getattr(model.config, "scan_layers", False):
        config = model.config.replace(scan_layers=False)
        model = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
    cache = jax.eval_shape(lambda: model.init_cache(batch, max_len))
    kv = sum(cache_nbytes(c) for c in jax.tree.leaves(
        cache, is_leaf=lambda x: isinstance(x, AttentionCache)) if isinstance(c, AttentionCache))
    total = cache_nbytes(cache)
    return {"cache_bytes": total, "cache_kv_bytes": kv, "cache_state_bytes": total - kv}


def device_memory_bytes(device: Any = None) -> int:
    """Memory of `device` (default: the first local one): the allocator's limit on GPU/TPU, the
    host's physical memory on CPU (where JAX reports no limit)."""
    stats = (device or jax.local_devices()[0]).memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_cache_fits(model: Any, batch: int, max_len: int) -> None:
    """Refuses a decode cache larger than the device's memory, before anything is allocated
    (XLA would fail inside the compiled loop, naming a buffer, not the length asked for)."""
    need, have = decode_cache_bytes(model, batch, max_len)["cache_bytes"], device_memory_bytes()
    if need > have:
        raise ValueError(f"the decode cache for batch {batch} x {max_len} positions needs "
                         f"{need / 2**30:.1f} GiB; the device has {have / 2**30:.1f} GiB: ask "
                         "for fewer new tokens or a smaller batch")
