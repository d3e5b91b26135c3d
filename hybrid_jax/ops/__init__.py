"""Pure functions on arrays: the math of every mixer (no parameters, no Flax).

Each op takes `implementation=` ("reference" | "xla" | "pallas" | None for auto); see
`hybrid_jax.ops.dispatch`.
"""

from hybrid_jax.ops.attention import (
    apply_rope,
    attention,
    attention_mask,
    cosine_logit_scale,
    l2_normalize,
    rotary_dim,
    scaled_cosine_attention,
)

__all__ = [
    "apply_rope",
    "attention",
    "attention_mask",
    "cosine_logit_scale",
    "l2_normalize",
    "rotary_dim",
    "scaled_cosine_attention",
]
