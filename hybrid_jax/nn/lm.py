"""A decoder-only language model built from `ModelConfig.layers` through the block registry.

Every call builds one `TokenContext` (positions, segment ids, extra per-token arrays) and hands
it to every block, which hands it to every mixer: in the parallel forward pass, in `decode`
(positions continue from the cache) and so in `generate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from hybrid_jax.cache import (
    LMCache,
    check_cache_batch,
    check_cache_fresh,
    check_cache_room,
    check_token_ids,
)
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.common import (
    compute_dtype,
    dense_kwargs,
    norm,
    param_dtype,
    run_on_automatic_axes,
)
from hybrid_jax.nn.init_random import fast_random_compile
from hybrid_jax.nn.layers import Embedding, Linear, param
from hybrid_jax.ops.dispatch import KERNEL_RESIDUALS
from hybrid_jax.registry import block_type, mixer_type
from hybrid_jax.sharding import constrain, state_shardings, type_spec


class LanguageModel(nnx.Module):
    """Embeddings → blocks (one per `config.layers` entry) → final RMSNorm → LM head.

    `logits = model(tokens_BT)`; decoding: `cache = model.init_cache(batch, max_len)` then
    `logits, cache = model.decode(tokens_BT, cache)` for a prefill of any length or one token.
    Logits are float32. With `config.position_embedding == "learned"`, row p of
    `position_table` `[max_positions, d_model]` is added to the embedding of the token at
    position p (the packed-document `positions_BT` when given, else its index). Under a mesh
    with explicit axes (`jax.make_mesh`'s default) both calls run on automatic ones
    (`sharding.on_automatic_axes`): logits come back split as the tokens are, the cache as it
    came.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = Embedding(config.vocab_size, config.d_model, rngs=rngs, std=config.init_std,
                               dtype=compute_dtype(config), param_dtype=param_dtype(config))
        self.position_table = (
            param(rngs, nnx.initializers.normal(config.init_std),
                  (config.max_positions, config.d_model), param_dtype(config), ("seq", "embed"))
            if config.position_embedding == "learned" else None)
        self.blocks = (_stacked_blocks(config, rngs) if config.scan_layers else
                       nnx.List(_build_blocks(config, range(len(config.layers)), rngs)))
        self.final_norm = norm(config)
        self.lm_head = (None if config.tie_embeddings else
                        Linear(config.d_model, config.vocab_size, axes=("embed", "vocab"),
                               **dense_kwargs(config, rngs)))

    def _check_tokens(self, tokens_BT: jax.Array) -> None:
        if tokens_BT.ndim != 2 or not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
            raise ValueError(f"tokens must be an integer array [batch, time], got shape "
                             f"{tuple(tokens_BT.shape)} dtype {tokens_BT.dtype}")
        if 0 in tokens_BT.shape:
            raise ValueError(f"tokens must hold at least one token per row and one row, got "
                             f"shape {tuple(tokens_BT.shape)}")
        check_token_ids(tokens_BT, self.config.vocab_size)

    def _embed(self, tokens_BT: jax.Array, positions_BT: jax.Array) -> jax.Array:
        """`[B, T]` tokens at `[B, T]` positions → `[B, T, D]` input of the first block.

        Traced ids outside `[0, vocab_size)` (which `_check_tokens` cannot see inside jit)
        embed as NaN, so the logits and the loss show them instead of a wrapped-around row."""
        x = self.embed(tokens_BT)
        valid_BT = (tokens_BT >= 0) & (tokens_BT < self.config.vocab_size)
        x = jnp.where(valid_BT[..., None], x, jnp.nan)
        if self.position_table is None:
            return x
        # A traced position past the table (packed positions_BT, decode past init_cache's
        # checked max_len) reads NaN instead of a clamped row: the loss shows it.
        rows = jnp.take(self.position_table[...], positions_BT, axis=0, mode="fill",
                        fill_value=jnp.nan)
        return x + rows.astype(x.dtype)

    def _check_length(self, length: int, what: str) -> None:
        limit = self.config.max_positions
        if self.position_table is not None and length > limit:
            raise ValueError(f"{what} of {length} positions, expected at most "
                             f"ModelConfig.max_positions={limit} (the learned position table)")

    def _logits(self, x_BTD: jax.Array) -> jax.Array:
        x = self.final_norm(x_BTD)
        if self.lm_head is None:
            logits = self.embed.attend(x)
        else:
            logits = self.lm_head.logits(x)
        return constrain(logits, ("batch", "seq", "vocab"))

    def __call__(self, tokens_BT: jax.Array, context: TokenContext | None = None, *,
                 positions_BT: jax.Array | None = None, segment_ids_BT: jax.Array | None = None,
                 extras: dict[str, jax.Array] | None = None) -> jax.Array:
        """Parallel forward pass: `[B, T]` tokens → `[B, T, vocab]` float32 logits.

        Either a `TokenContext`, or its parts: `segment_ids_BT` marks packed documents (no
        mixing across them); `positions_BT` (default `0..T−1`, or with segment ids each
        token's place in its document) restart at each document when packing; `extras` are
        further per-token arrays `[B, T, ...]` for mixers that read them.
        """
        self._check_tokens(tokens_BT)
        self._check_length(tokens_BT.shape[1], "a sequence")
        if context is None:
            context = TokenContext.create(tuple(tokens_BT.shape), positions=positions_BT,
                                          segment_ids=segment_ids_BT, extras=extras)
        elif positions_BT is not None or segment_ids_BT is not None or extras is not None:
            raise ValueError("pass either context= or positions_BT / segment_ids_BT / extras, "
                             "not both")
        return run_on_automatic_axes(self, LanguageModel._forward,
                                     lambda: _logits_spec(tokens_BT), tokens_BT, context)

    def _forward(self, tokens_BT: jax.Array, context: TokenContext) -> jax.Array:
        x = constrain(self._embed(tokens_BT, context.positions), ("batch", "seq", "embed"))
        x = _run_blocks(self.config, self.blocks, x, context)
        return self._logits(x)

    def init_cache(self, batch: int, max_len: int, dtype: Any = None, *,
                   windowed: bool = False) -> LMCache:
        """An empty decode state for `batch` sequences of up to `max_len` tokens; `windowed`:
        decoding may go on past `max_len`, attention then seeing the last `max_len` tokens."""
        _check_unscanned(self.config, "decoding")
        if batch < 1 or max_len < 1:
            raise ValueError(f"init_cache needs batch >= 1 and max_len >= 1, got batch={batch}, "
                             f"max_len={max_len}")
        self._check_length(max_len, "a decode cache")
        dtype = compute_dtype(self.config) if dtype is None else jnp.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):  # keys, values, conv inputs are cast to it
            raise ValueError(f"init_cache: dtype must be a floating-point dtype (e.g. bfloat16, "
                             f"float32), got {dtype}")
        return LMCache(index=jnp.zeros((), jnp.int32),
                       layers=tuple(b.init_cache(batch, max_len, dtype) for b in self.blocks),
                       max_len=max_len, windowed=windowed, batch=batch)

    def decode(self, tokens_BT: jax.Array, cache: LMCache, *,
               extras: dict[str, jax.Array] | None = None, record_steps: bool = False,
               fresh_cache: bool = False) -> tuple[jax.Array, LMCache]:
        """Consumes `tokens_BT` after what `cache` holds; returns their logits and the new cache.

        Positions continue from the cache (one document per row); `extras` are the per-token
        arrays `[B, T, ...]` of these tokens, as in `__call__`. `record_steps`: layers that can
        return their state after each of these tokens do (`TokenContext.record_steps`; the
        cache must then be rolled back, `hybrid_jax.speculative.rollback`). Past the cache's
        `max_len` (unless it is `windowed`) this raises; inside jit, where the position is
        traced, the logits of such a call are NaN instead. `fresh_cache`: the cache is
        `init_cache`'s, nothing consumed yet (a prefill), so attention attends among these
        tokens alone on its fast rungs, as in `__call__` (the cached form passes explicit
        positions, which only the XLA rung takes, in memory T × (cache length + T)); the
        results are the same. On a cache that holds tokens it raises (NaN logits under jit).
        """
        _check_unscanned(self.config, "decoding")
        self._check_tokens(tokens_BT)
        check_cache_batch(cache, tokens_BT.shape[0])
        self._check_cache_layers(cache)
        refused = [check_cache_room(cache, tokens_BT.shape[1])]
        end = cache.index + tokens_BT.shape[1]  # a windowed cache may pass the table
        if self.position_table is not None and not isinstance(end, jax.core.Tracer) and (
                int(end) > self.config.max_positions):  # (traced: NaN rows, see `_embed`)
            raise ValueError(f"decoding {tokens_BT.shape[1]} token(s) after {int(cache.index)} "
                             f"needs positions up to {int(end) - 1}, past the learned position "
                             f"table's ModelConfig.max_positions={self.config.max_positions}")
        if fresh_cache:
            refused.append(check_cache_fresh(cache))
        context = TokenContext.create(tuple(tokens_BT.shape), start=cache.index, extras=extras,
                                      record_steps=record_steps, fresh_cache=fresh_cache)
        # The cache leaves as it came: a decode loop's carry keeps its type.
        logits, new_cache = run_on_automatic_axes(
            self, LanguageModel._decode,
            lambda: (_logits_spec(tokens_BT), jax.tree.map(type_spec, cache)),
            tokens_BT, cache, context)
        for refuse in refused:
            if refuse is not None:
                logits = jnp.where(refuse, jnp.nan, logits)
        return logits, new_cache

    def _decode(self, tokens_BT: jax.Array, cache: LMCache, context: TokenContext
                ) -> tuple[jax.Array, LMCache]:
        x = self._embed(tokens_BT, context.positions)
        layer_caches = []
        for block, layer_cache in zip(self.blocks, cache.layers, strict=True):
            x, layer_cache = block.decode(x, layer_cache, context)
            layer_caches.append(layer_cache)
        new_cache = cache.replace(index=cache.index + tokens_BT.shape[1],
                                  layers=tuple(layer_caches))
        return self._logits(x), new_cache

    def _check_cache_layers(self, cache: LMCache) -> None:
        """Refuses a cache whose layers are not this model's (another model's, or cut short):
        each mixer would fail on its own, naming a field missing from another mixer's cache."""
        expected = _layer_caches(self)
        if len(cache.layers) != len(expected):
            raise ValueError(f"decode: the cache holds {len(cache.layers)} layers, the model has "
                             f"{len(expected)}: make the cache with this model's init_cache")
        for i, (layer_cache, wanted) in enumerate(zip(cache.layers, expected, strict=True)):
            if jax.tree.structure(layer_cache) != jax.tree.structure(wanted):
                raise ValueError(
                    f"decode: the cache's layer {i} is {_cache_kinds(layer_cache)}, this model's "
                    f"layer {i} ({self.config.layers[i].type!r}) needs {_cache_kinds(wanted)}: "
                    "make the cache with this model's init_cache")

    def with_window(self, window: int | None, *, layers: Sequence[int] | None = None
                    ) -> LanguageModel:
        """This model with `window` in `layers` (default: every layer whose block type has a
        `window` option, e.g. attention and NHA, or a composite block with such a branch, e.g.
        PHA's attention), sharing its parameters: nothing is copied or retrained, and `config`
        records the new windows. Chain calls for per-layer values. A model with no window
        option anywhere raises ValueError."""
        config = _with_window(self.config, window, layers)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))))
        return nnx.merge(graphdef, nnx.state(self))


    def with_scan_layers(self, scan: bool) -> LanguageModel:
        """This model with its layers stacked for `nnx.scan` (`scan=True`, fast compiles) or
        one module per layer (`False`: decoding, export), the same values (a copy when the
        layout changes). Stacked group member j of group g is layer g·period + j."""
        if self.config.scan_layers == scan:
            return self
        config = self.config.replace(scan_layers=scan)
        graphdef, target = nnx.split(nnx.eval_shape(lambda: LanguageModel(config,
                                                                          rngs=nnx.Rngs(0))))
        source = dict(nnx.to_flat_state(nnx.state(self)))
        period, groups = layer_period(config.layers), len(config.layers) // layer_period(
            config.layers)
        filled = []
        for path, variable in nnx.to_flat_state(target):
            if path[0] != "blocks":
                value = source[path].get_value()
            elif scan:  # member j of every group, stacked
                value = jnp.stack([source[("blocks", g * period + path[1], *path[2:])]
                                   .get_value() for g in range(groups)])
            else:
                value = source[("blocks", path[1] % period, *path[2:])].get_value()[
                    path[1] // period]
            filled.append((path, variable.replace(value)))
        return nnx.merge(graphdef, nnx.from_flat_state(filled))


def _logits_spec(tokens_BT: jax.Array) -> PartitionSpec:
    """The logits' PartitionSpec under explicit mesh axes: the tokens', vocabulary whole."""
    return PartitionSpec(*type_spec(tokens_BT), None)


# Each config's abstract layer caches (`_layer_caches`).
_LAYER_CACHES: dict[ModelConfig, tuple[Any, ...]] = {}


def _layer_caches(model: LanguageModel) -> tuple[Any, ...]:
    """Each layer's `init_cache(1, 1)`, abstract: their pytree structures are the config's
    (computed once a config, as eager decoding checks every call)."""
    if model.config not in _LAYER_CACHES:
        _LAYER_CACHES[model.config] = jax.eval_shape(
            lambda: tuple(block.init_cache(1, 1, jnp.float32) for block in model.blocks))
    return _LAYER_CACHES[model.config]


def _cache_kinds(layer_cache: Any) -> str:
    """A layer cache's class and its branches' classes, e.g. `BlockCache(AttentionCache, None)`."""
    branches = getattr(layer_cache, "branches", None)
    if branches is None:
        return type(layer_cache).__name__
    inner = ", ".join("None" if b is None else type(b).__name__ for b in branches)
    return f"{type(layer_cache).__name__}({inner})"


def _build_blocks(config: ModelConfig, indices, rngs: nnx.Rngs) -> list[nnx.Module]:
    return [block_type(config.layers[i].type).build(config, config.block_options(i),
                                                    layer_index=i, rngs=rngs) for i in indices]


def layer_period(layers: Sequence[Any]) -> int:
    """The shortest p such that `layers` is its first p entries repeated."""
    return next(p for p in range(1, len(layers) + 1)
                if len(layers) % p == 0 and tuple(layers) == tuple(layers[:p]) * (len(layers) // p))


def layer_ndim(top: str, ndim: int, scan_layers: bool) -> int:
    """The axes of one layer's share of a parameter of `ndim` axes under the model's attribute
    `top` (`"blocks"`, `"embed"`, ...): with `scan_layers` every parameter under `blocks`
    carries a leading axis over the layer groups (`_stacked_blocks`), so a norm's scale is
    `[groups, D]` and still no matrix."""
    return ndim - (scan_layers and top == "blocks")


def _stacked_blocks(config: ModelConfig, rngs: nnx.Rngs) -> nnx.List:
    """One group of `layer_period` blocks with every parameter stacked over the groups (a
    leading axis, unsharded), for `nnx.scan`. Every group draws its own initial values."""
    period = layer_period(config.layers)

    @nnx.split_rngs(splits=len(config.layers) // period)
    @nnx.vmap(in_axes=0, out_axes=0)
    def build(rngs: nnx.Rngs) -> nnx.List:
        return nnx.List(_build_blocks(config, range(period), rngs))

    group = build(rngs)
    for _, variable in nnx.iter_graph(group):
        axes = variable.get_metadata().get("logical_axes") if isinstance(
            variable, nnx.Variable) else None
        if axes is not None and len(axes) == variable.get_value().ndim - 1:
            variable.set_metadata(logical_axes=(None, *axes))
    return group


_REMAT_POLICIES = {  # config.remat → what the backward keeps of a block (None: nothing)
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "kernels": jax.checkpoint_policies.save_only_these_names(KERNEL_RESIDUALS),
}


def _run_blocks(config: ModelConfig, blocks: nnx.List, x: jax.Array, context: TokenContext
                ) -> jax.Array:
    """The blocks on `x`, rematerialised per `config.remat`, scanned when stacked."""
    def run(blocks, x):
        for block in blocks:
            x = block(x, context)
        return x

    if config.remat != "none":
        run = nnx.remat(run, policy=_REMAT_POLICIES[config.remat])
    if not config.scan_layers:
        for block in blocks:
            x = run([block], x)
        return x
    scanned = nnx.scan(lambda x, group: run(group, x), in_axes=(nnx.Carry, 0),
                       out_axes=nnx.Carry)
    # A tuple, not the nnx.List: flax 0.12.8's nnx.capture (diagnostics) fails on a scanned List.
    return scanned(x, tuple(blocks))


def _check_unscanned(config: ModelConfig, what: str) -> None:
    if config.scan_layers:
        raise ValueError(f"{what} needs ModelConfig.scan_layers=False (a scanned model stacks "
                         "its layers for training); build the model without it")


def _with_window(config: ModelConfig, window: int | None, layers: Sequence[int] | None
                 ) -> ModelConfig:
    specs = list(config.layers)
    changed = {i: _layer_with_window(config, i, window) for i in range(len(specs))}
    windowed = [i for i, spec in changed.items() if spec is not None]
    if not windowed:  # else the model came back unchanged, as if it had taken the window
        raise ValueError(f"with_window: no layer has a window option (layer types "
                         f"{sorted({spec.type for spec in specs})})")
    for i in windowed if layers is None else layers:
        if i not in windowed:
            raise ValueError(f"with_window: layer {i} has no window option; layers with one: "
                             f"{windowed}")
        specs[i] = changed[i]
    return config.replace(layers=tuple(specs))


def _has_window(options_cls: type) -> bool:
    return "window" in {f.name for f in dataclasses.fields(options_cls)}


def _layer_with_window(config: ModelConfig, index: int, window: int | None) -> Any:
    """Layer `index`'s spec with `window`: its block type's own option, or in a composite block
    (sequential, parallel, pha) that of every branch whose mixer has one (PHA's attention);
    None if nothing in the layer has a window."""
    spec = config.layers[index]
    if _has_window(block_type(spec.type).options):
        return layer(spec.type, **{**dict(spec.options), "window": window})
    branches = getattr(config.block_options(index), "branches", ())  # defaults resolved
    if not any(_has_window(mixer_type(b.type).options) for b in branches):
        return None
    branches = tuple(layer(b.type, **{**dict(b.options), "window": window})
                     if _has_window(mixer_type(b.type).options) else b for b in branches)
    return layer(spec.type, **{**dict(spec.options), "branches": branches})


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters."""
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def create_model(config: ModelConfig, *, seed: int = 0, mesh: Mesh | None = None
                 ) -> LanguageModel:
    """Builds a `LanguageModel` in one compiled call, sharded over `mesh` when given.

    Initialising inside `jit` avoids one compile per parameter, and with a mesh every parameter
    is created directly in its sharding (from its `logical_axes`), never whole on one device.
    """

    def init() -> nnx.State:
        return nnx.split(LanguageModel(config, rngs=nnx.Rngs(seed)))[1]

    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: LanguageModel(config,
                                                                              rngs=nnx.Rngs(seed))))
    out_shardings = None if mesh is None else state_shardings(abstract_state, mesh)
    with fast_random_compile(mesh):
        state = jax.jit(init, out_shardings=out_shardings)()
    return nnx.merge(graphdef, state)
