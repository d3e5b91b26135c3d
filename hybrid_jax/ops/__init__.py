"""Pure functions on arrays: the math of every mixer (no parameters, no Flax).

Each op takes `implementation=` ("reference" | "xla" | "pallas" | None for auto); see
`hybrid_jax.ops.dispatch`. One-step decode forms end in `_step`.
"""

from hybrid_jax.ops.attention import (
    apply_rope,
    attention,
    attention_mask,
    attention_rung,
    cosine_logit_scale,
    l2_normalize,
    rotary_dim,
    scaled_cosine_attention,
    segment_extents,
)
from hybrid_jax.ops.delta_rule import gated_delta_rule, gated_delta_rule_step
from hybrid_jax.ops.dss import dss, dss_discretize, dss_kernel, dss_step
from hybrid_jax.ops.gsa import (
    gated_slot_attention,
    gated_slot_attention_step,
    gsa_slot_logits,
    gsa_slot_readout,
)
from hybrid_jax.ops.logit_stats import logit_stats
from hybrid_jax.ops.logits import logits
from hybrid_jax.ops.nha import (
    NHAState,
    native_hybrid_attention,
    native_hybrid_attention_step,
    nha_empty_state,
)
from hybrid_jax.ops.norms import gated_rms_norm, rms_norm, rms_normalize
from hybrid_jax.ops.short_conv import short_conv
from hybrid_jax.ops.ssd import ssd, ssd_step

__all__ = [
    "NHAState",
    "apply_rope",
    "attention",
    "attention_mask",
    "attention_rung",
    "cosine_logit_scale",
    "dss",
    "dss_discretize",
    "dss_kernel",
    "dss_step",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "gated_rms_norm",
    "gated_slot_attention",
    "gated_slot_attention_step",
    "gsa_slot_logits",
    "gsa_slot_readout",
    "l2_normalize",
    "logit_stats",
    "logits",
    "native_hybrid_attention",
    "native_hybrid_attention_step",
    "nha_empty_state",
    "rms_norm",
    "rms_normalize",
    "rotary_dim",
    "scaled_cosine_attention",
    "segment_extents",
    "short_conv",
    "ssd",
    "ssd_step",
]
