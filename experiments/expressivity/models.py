"""The study's architectures and a helper that sizes them to a parameter budget.

An architecture is a pattern of layer kinds, "A" (sliding-window attention) and "S" (an SSM
block type from the registry, `mamba1` or `mamba2`): pure transformer "AA", pure SSM "SS" and
the hybrids "SA" (SSM → attention) and "AS" (attention → SSM), the study's four; plus
"transformer-1layer" ("A"), a depth ablation. `size_model` picks the width (d_model) whose
exact parameter count, embeddings included, is closest to the budget.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from flax import nnx

from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.nn.lm import LanguageModel, count_params

ARCHITECTURES = {
    "transformer": "AA",
    "ssm": "SS",
    "ssm-attention": "SA",
    "attention-ssm": "AS",
    "transformer-1layer": "A",
}
STUDY_ARCHITECTURES = ("transformer", "ssm", "ssm-attention", "attention-ssm")
POSITIONS = ("rope", "learned")


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """How models of every size are shaped; only `d_model` changes with the budget.

    `window`: attention window (None: full causal). `ffn_ratio`: SwiGLU width as a multiple of
    d_model in every block (0: no FFN sublayer). `ssm_type`: the registered SSM block type;
    `ssm_options` are passed to it (e.g. `state_size`). d_model runs over multiples of
    `2·num_heads` (RoPE needs an even head size).

    `position`: how attention layers learn where tokens are, for every architecture alike:
    "rope" (rotary embeddings on `rope_fraction` of each head's channels; 0: no positional
    encoding) or "learned" (GPT-2 style: no RoPE, a trained `[max_positions, d_model]` table
    added to the token embeddings, whose parameters count in the budget, also in pure SSMs).
    """

    ssm_type: str = "mamba1"
    ssm_options: tuple[tuple[str, object], ...] = (("state_size", 8),)
    window: int | None = 16
    num_heads: int = 2
    ffn_ratio: float = 0.0
    repeats: int = 1  # the pattern is repeated, e.g. "SA" · 2 = 4 layers
    rope_fraction: float = 1.0  # of each attention head's channels; 0: no positional encoding
    position: str = "rope"  # "rope" | "learned"
    max_positions: int = 100  # the learned table's length: the tasks' sequence length
    max_d_model: int = 512

    def __post_init__(self) -> None:
        if self.position not in POSITIONS:
            raise ValueError(f"ModelFamily.position={self.position!r}: expected one of "
                             f"{list(POSITIONS)}")
        if self.position == "learned" and self.rope_fraction != 1.0:
            raise ValueError(f"ModelFamily.rope_fraction={self.rope_fraction}: applies to "
                             "position='rope' only (position='learned' uses no RoPE)")

    def config(self, architecture: str, d_model: int, vocab_size: int) -> ModelConfig:
        if architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {architecture!r}; expected one of "
                             f"{sorted(ARCHITECTURES)}")
        kinds = {"A": layer("attention", window=self.window),
                 "S": layer(self.ssm_type, **dict(self.ssm_options))}
        return ModelConfig(layers=tuple(kinds[k] for k in ARCHITECTURES[architecture]
                                        * self.repeats),
                           vocab_size=vocab_size, d_model=d_model, num_heads=self.num_heads,
                           ffn_dim=round(self.ffn_ratio * d_model), **self._position_fields())

    def _position_fields(self) -> dict[str, object]:
        if self.position == "learned":
            return dict(rope_fraction=0.0, position_embedding="learned",
                        max_positions=self.max_positions)
        return dict(rope_fraction=self.rope_fraction)


@functools.lru_cache(maxsize=4096)
def parameter_count(config: ModelConfig) -> int:
    """Exact trainable parameters of a model (abstract init: no arrays are allocated)."""
    return count_params(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))))


def size_model(family: ModelFamily, architecture: str, budget: int, vocab_size: int
               ) -> tuple[ModelConfig, int]:
    """The model of `architecture` whose parameter count is closest to `budget` (in ratio).

    Returns `(config, params)`. The count grows with d_model, so a binary search over the
    allowed widths finds the two neighbours of the budget.
    """
    if budget < 1:
        raise ValueError(f"budget={budget}: expected a positive number of parameters")
    step = 2 * family.num_heads
    widths = list(range(step, family.max_d_model + 1, step))
    count = lambda d: parameter_count(family.config(architecture, d, vocab_size))
    lo, hi = 0, len(widths) - 1
    while lo < hi:  # the first width whose count reaches the budget
        mid = (lo + hi) // 2
        if count(widths[mid]) >= budget:
            hi = mid
        else:
            lo = mid + 1
    candidates = {widths[i] for i in (lo - 1, lo) if i >= 0}
    best = min(candidates, key=lambda d: abs(math.log(count(d) / budget)))
    return family.config(architecture, best, vocab_size), count(best)
