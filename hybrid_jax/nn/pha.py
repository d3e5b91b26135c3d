"""PHA, the parallel hybrid block: block type "pha", a preset of the generic parallel block.

    h = x                                            (DeepNorm is post-norm: x is normalised)
    y = Σ_i w_i · RMSNorm_i(branch_i(h)),   w_i = softplus(p_i) / Σ_j softplus(p_j)
    x ← RMSNorm(α·x + y),   α = (2L)^{1/4}

with three branches on the same input: GSS (`nn/gss.py`), grouped-query attention with RoPE
and scaled-cosine logits (queries and keys L2-normalised, a learnable per-head temperature
initialised to √head_dim, so training starts at ordinary attention's logit scale; sliding
window optional through `window`), and a Dual-FFN (`nn/ffn.py`: a primary SwiGLU arm plus a
smaller auxiliary arm, summed). DeepNorm's init is DeepNet's: Xavier-normal kernels, with gain
β = (8L)^{−1/4} on the value and output projections of every branch and on the FFN arms' up/down
projections (each mixer's `deepnorm_scaled`), gain 1 on the others (`nn/blocks.py`).

Everything is `BlockOptions` (`nn/blocks.py`), so any of it can be changed per layer or with
`--set model.<option>=...`, and other parallel blocks are config alone, e.g.
`layer("parallel", branches=("gdn", "attention", "ffn"), mixing="learned")`.

Choices where the paper is not specific (all exposed in the config):
- Norm placement: one RMSNorm per branch output (the paper's per-branch norms) and DeepNorm's
  post-norm after the residual; no input norm, since the post-norm already normalises every
  block's input (`residual="pre_norm"` gives a pre-norm variant).
- Mixing init: p_i = softplus⁻¹(1), equal weights 1/3 (`mixing_init`): no branch is favoured
  before training; the "sandwich" has to be learned.
- Auxiliary FFN width: a quarter of the primary (`DualFFNOptions.aux_ffn_dim`).
- GSS sizes: expansion 2 (gate width 2·d_model; GSS alone uses 4 because it has no FFN, here
  the Dual-FFN carries the position-wise capacity), DSS width d_model/4 and 64 modes
  (`branches` → `layer("gss", expansion=..., state_size=...)`).
- Attention: grouped-query with 4 query heads per key/value head in the presets (pha-125m:
  5; `num_kv_heads`).
"""

from __future__ import annotations

from hybrid_jax.config import layer
from hybrid_jax.nn.blocks import BlockOptions, build_block
from hybrid_jax.registry import register_block

PHA_BRANCHES = (layer("gss", expansion=2, state_size=64), layer("attention", cosine=True),
                "dual_ffn")
PHA_DEFAULTS = dict(branches=PHA_BRANCHES, layout="parallel", residual="deepnorm",
                    branch_norm=True, mixing="learned")

register_block("pha", BlockOptions,
               "PHA: GSS ‖ GQA cosine attention ‖ Dual-FFN, per-branch RMSNorm, softplus mixing, "
               "DeepNorm", defaults=PHA_DEFAULTS)(build_block)
