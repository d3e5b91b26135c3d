"""Synthetic tasks of the expressivity–efficiency study (Cooper et al., 2026); importing this
package registers their data kinds: "selective-copying", "ar-decoding", "mkar", "needle" (MQAR
is `hybrid_jax.data.mqar`)."""

from hybrid_jax.data.tasks.ar_decoding import ARDecodingConfig
from hybrid_jax.data.tasks.common import split_config
from hybrid_jax.data.tasks.mkar import MKARConfig
from hybrid_jax.data.tasks.needle import NeedleConfig
from hybrid_jax.data.tasks.selective_copying import SelectiveCopyingConfig

__all__ = ["ARDecodingConfig", "MKARConfig", "NeedleConfig", "SelectiveCopyingConfig",
           "split_config"]
