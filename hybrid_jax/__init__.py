"""hybrid_jax: hybrid attention / linear-recurrence sequence models in JAX and Flax NNX."""

from hybrid_jax.xla_flags import exclude_faulty_cpu_fusion

exclude_faulty_cpu_fusion()  # before anything starts a JAX backend

from hybrid_jax import ops, presets  # noqa: E402
from hybrid_jax.config import (  # noqa: E402
    ExperimentConfig,
    LayerSpec,
    MeshConfig,
    ModelConfig,
    TrainConfig,
    layer,
)
from hybrid_jax.context import TokenContext  # noqa: E402
from hybrid_jax.generate_text import generate_text  # noqa: E402
from hybrid_jax.nn import LanguageModel, count_params, create_model  # noqa: E402

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
