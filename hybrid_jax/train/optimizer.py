"""AdamW with linear warmup and cosine decay, global-norm clipping, decay on matrices only;
`TrainConfig.freeze` keeps the matching parameters fixed (fine-tuning with frozen MLPs)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from hybrid_jax.config import TrainConfig
from hybrid_jax.nn.lm import layer_ndim, layer_period

# Leaves of at most this many elements share one reduction in `global_norm`.
SMALL_LEAF = 1 << 16


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
    """Linear warmup to `learning_rate`, cosine decay to `learning_rate·min_lr_ratio`."""
    warmup = min(config.warmup_steps, config.steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(config.steps, warmup + 1),
        end_value=config.learning_rate * config.min_lr_ratio,
    )


# Parameters never decayed whatever their shape: SSM decay rates (A = −exp(A_log)), which
# Mamba-1 holds as a `[d_inner, state]` matrix; decay pulled every A towards −1.
NEVER_DECAYED = frozenset({"A_log"})


def _decay_mask(scan_layers: bool):
    """Weight decay on matrices (projections, embeddings), not on norms, biases or gates, nor on
    the SSM decay rates of `NEVER_DECAYED`.

    With `scan_layers` a parameter's axis over the layer groups is not counted
    (`layer_ndim`), else scanned models decayed their norms, biases and SSM vectors (A_log, D,
    dt_bias)."""
    from hybrid_jax.train.checkpoint import leaf_name

    def decayed(path, p) -> bool:
        name = leaf_name(path).split("/")
        return (name[-1] not in NEVER_DECAYED
                and layer_ndim(name[0], p.ndim, scan_layers) >= 2)

    return lambda params: jax.tree_util.tree_map_with_path(decayed, params)


def _frozen(pattern: str, path: tuple) -> bool:
    """Whether the parameter at `path` (named `blocks/0/ffn/up/kernel`) matches `pattern`."""
    from hybrid_jax.train.checkpoint import leaf_name

    return _names(pattern, leaf_name(path))


def _names(pattern: str, name: str) -> bool:
    """Whether `train.freeze=pattern` names the parameter called `name`."""
    return bool(pattern) and re.search(pattern, name) is not None


def _frozen_mask(pattern: str):
    """Parameters whose name matches `pattern`: never updated."""
    return lambda params: jax.tree_util.tree_map_with_path(
        lambda path, _: _frozen(pattern, path), params)


def check_freeze(pattern: str, params, layers: Sequence | None = None) -> None:
    """Refuses a `train.freeze` that matches no parameter of `params` (a mistyped name would
    train everything, silently) or every one (nothing would train). `layers`: those of a model
    with stacked layers (`scan_layers`), whose array `blocks/j/...` holds layers j, j + p, ...
    (p: `layer_period`): a pattern that names some of them and not the others is refused (it
    froze them all, or none)."""
    if not pattern:
        return
    from hybrid_jax.train.checkpoint import leaf_name

    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    if layers is not None:
        _check_stacked_freeze(pattern, [leaf_name(path) for path in paths], layers)
    frozen = sum(_frozen(pattern, path) for path in paths)
    if frozen == 0:
        examples = ", ".join(leaf_name(path) for path in paths[:3])
        raise ValueError(f"train.freeze={pattern!r} matches no parameter, so nothing would be "
                         f"frozen (names look like {examples}, ...)")
    if frozen == len(paths):
        raise ValueError(f"train.freeze={pattern!r} matches all {frozen} parameters: nothing "
                         "would train")


def _check_stacked_freeze(pattern: str, names: list[str], layers: Sequence) -> None:
    period = layer_period(layers)
    for name in names:
        parts = name.split("/")
        if parts[0] != "blocks" or not parts[1].isdigit():
            continue
        stacked = range(int(parts[1]), len(layers), period)
        each = {i: _names(pattern, "/".join(["blocks", str(i), *parts[2:]])) for i in stacked}
        if set(each.values()) != {_names(pattern, name)}:
            named = [i for i, hit in each.items() if hit]
            raise ValueError(
                f"train.freeze={pattern!r} names layers {named} of the stacked parameter {name} "
                f"(model.scan_layers: it holds layers {list(stacked)}, frozen or trained "
                "together): name all of them or none, or set model.scan_layers=false")


def global_norm(tree) -> jax.Array:
    """√(Σ x²) over every leaf of `tree`, summed in float32.

    Each leaf reduced alone is a kernel of its own on a GPU: mamba2-340m's 771 gradients (48
    layers of 16, most of them conv taps, biases, norm scales and per-head vectors of a few
    thousand elements) made 771 reductions of ≈ 1 µs each, each with its launch gap. The small
    leaves (≤ `SMALL_LEAF` elements) are concatenated and reduced once; the large ones one by
    one. (Sharded small leaves are gathered for the concatenation: a few KB each.)"""
    leaves = jax.tree.leaves(tree)
    square_sum = lambda x: jnp.sum(jnp.square(x.astype(jnp.float32)))
    small = [_unsplit(x).reshape(-1) for x in leaves if x.size <= SMALL_LEAF]
    sums = [square_sum(x) for x in leaves if x.size > SMALL_LEAF]
    if small:
        sums.append(square_sum(jnp.concatenate([x.astype(jnp.float32) for x in small])))
    return jnp.sqrt(sum(sums, jnp.zeros((), jnp.float32)))


def _unsplit(x: jax.Array) -> jax.Array:
    """`x` replicated where its type carries a split (explicit-sharding meshes refuse to
    concatenate arrays split differently; under auto sharding XLA gathers what it needs)."""
    sharding = jax.typeof(x).sharding
    if any(axes is not None for axes in sharding.spec):
        return jax.sharding.reshard(x, sharding.update(spec=PartitionSpec()))
    return x


def clip_by_global_norm(max_norm: float, freeze: str = "") -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` with the norm of `global_norm`: updates scaled by
    max_norm / norm when the norm exceeds max_norm (the same arithmetic, and the same empty
    state, so checkpoints of either restore into the other).

    `freeze`: a `train.freeze` pattern; the norm leaves out the parameters it names
    (`trained_norm`), whose gradient would otherwise shrink the steps of the trained ones."""

    def update(updates, state, params=None):
        del params
        norm = trained_norm(updates, freeze)
        keep = norm < max_norm
        return jax.tree.map(
            lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm),
            updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def trained_norm(grads, freeze: str = "") -> jax.Array:
    """`global_norm` of the gradients of the parameters that train: those `freeze` (a
    `train.freeze` pattern) names are not counted (None in their place: no leaf)."""
    if not freeze:
        return global_norm(grads)
    return global_norm(jax.tree.map(lambda g, frozen: None if frozen else g, grads,
                                    _frozen_mask(freeze)(grads)))


def make_optimizer(config: TrainConfig, *, scan_layers: bool) -> optax.GradientTransformation:
    """The optimizer of `config`; `scan_layers`: the model's `ModelConfig.scan_layers` (its
    blocks' parameters are stacked, see `_decay_mask`). Required: a default of False would
    decay a scanned model's norms again wherever a caller forgot it."""
    transforms = []
    if config.grad_clip is not None:
        transforms.append(clip_by_global_norm(config.grad_clip, config.freeze))
    transforms.append(optax.adamw(learning_rate_schedule(config), b1=config.beta1,
                                  b2=config.beta2, weight_decay=config.weight_decay,
                                  mask=_decay_mask(scan_layers)))
    # Zeroing the final updates (not the gradients) also keeps weight decay off frozen
    # parameters. Always present (it holds no arrays), so `freeze` can change on --resume.
    transforms.append(optax.masked(optax.set_to_zero(), _frozen_mask(config.freeze)))
    return optax.chain(*transforms)
