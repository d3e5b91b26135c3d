"""Data pipelines (grain): synthetic tasks and text. Importing registers the data kinds."""

from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.pipeline import eval_batches, train_iterator

__all__ = ["MQARConfig", "eval_batches", "train_iterator"]
