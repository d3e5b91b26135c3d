"""hybrid_jax: hybrid attention / linear-recurrence sequence models in JAX and Flax NNX."""

from hybrid_jax import ops, presets
from hybrid_jax.config import (
    ExperimentConfig,
    LayerSpec,
    MeshConfig,
    ModelConfig,
    TrainConfig,
    layer,
)
from hybrid_jax.context import TokenContext
from hybrid_jax.generate_text import generate_text
from hybrid_jax.nn import LanguageModel, count_params, create_model

__all__ = [
    "ExperimentConfig",
    "LanguageModel",
    "LayerSpec",
    "MeshConfig",
    "ModelConfig",
    "TokenContext",
    "TrainConfig",
    "count_params",
    "create_model",
    "generate_text",
    "layer",
    "ops",
    "presets",
]
