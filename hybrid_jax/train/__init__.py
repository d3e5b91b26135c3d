"""Training: optimizer, loss, the jitted train step and loop, checkpoints, metrics."""

from hybrid_jax.train.trainer import TrainState, evaluate, init_train_state, train

__all__ = ["TrainState", "evaluate", "init_train_state", "train"]
