"""hybrid_jax: hybrid attention / linear-recurrence sequence models in JAX and Flax NNX."""

from hybrid_jax import ops

__all__ = ["ops"]
