"""Data pipelines (grain): synthetic tasks and text. Importing registers the data kinds."""

from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.pipeline import eval_batches, train_iterator
from hybrid_jax.data.tasks import (  # the expressivity tasks register on import
    ARDecodingConfig,
    MKARConfig,
    NeedleConfig,
    SelectiveCopyingConfig,
)
from hybrid_jax.data.text import TextConfig

__all__ = [
    "ARDecodingConfig",
    "MKARConfig",
    "MQARConfig",
    "NeedleConfig",
    "SelectiveCopyingConfig",
    "TextConfig",
    "eval_batches",
    "train_iterator",
]
