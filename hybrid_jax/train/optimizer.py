"""AdamW with linear warmup and cosine decay, global-norm clipping, decay on matrices only;
`TrainConfig.freeze` keeps the matching parameters fixed (fine-tuning with frozen MLPs)."""

from __future__ import annotations

import re

import jax
import optax

from hybrid_jax.config import TrainConfig


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


def _decay_mask(params):
    # Weight decay on matrices (projections, embeddings), not on norms, biases or gates.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _frozen_mask(pattern: str):
    """Parameters whose name (`blocks/0/ffn/up/kernel`) matches `pattern`: never updated."""
    from hybrid_jax.train.checkpoint import leaf_name

    return lambda params: jax.tree_util.tree_map_with_path(
        lambda path, _: bool(pattern) and re.search(pattern, leaf_name(path)) is not None, params)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    transforms = []
    if config.grad_clip is not None:
        transforms.append(optax.clip_by_global_norm(config.grad_clip))
    transforms.append(optax.adamw(learning_rate_schedule(config), b1=config.beta1,
                                  b2=config.beta2, weight_decay=config.weight_decay,
                                  mask=_decay_mask))
    # Zeroing the final updates (not the gradients) also keeps weight decay off frozen
    # parameters. Always present (it holds no arrays), so `freeze` can change on --resume.
    transforms.append(optax.masked(optax.set_to_zero(), _frozen_mask(config.freeze)))
    return optax.chain(*transforms)
