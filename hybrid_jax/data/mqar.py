"""Multi-query associative recall (MQAR), following the zoology generator (Arora et al., 2023).

A sequence starts with `num_kv_pairs` key-value pairs (keys from the first half of the
vocabulary, values from the second, none repeated), followed by queries: each key reappears once,
at a position drawn with power-law gaps (short gaps likelier), and the model must predict its
value at that position. Every other position holds a random token (or 0) and is not scored.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_jax.config import register_data
from hybrid_jax.data.synthetic import SyntheticSource, example_rng


@register_data("mqar")
@dataclasses.dataclass(frozen=True)
class MQARConfig:
    vocab_size: int = 256
    seq_len: int = 64
    num_kv_pairs: int = 8
    power_a: float = 0.01  # gap distribution p(g) ∝ a·g^(a−1)
    random_non_queries: bool = True  # fill unscored positions with random tokens (else 0)
    num_train_examples: int = 100_000
    num_eval_examples: int = 1_000

    def __post_init__(self) -> None:
        name = "MQARConfig"
        if self.seq_len % 2 or self.seq_len < 4:
            raise ValueError(f"{name}.seq_len={self.seq_len}: expected an even length >= 4")
        if self.num_kv_pairs < 1 or 4 * self.num_kv_pairs > self.seq_len:
            raise ValueError(f"{name}.num_kv_pairs={self.num_kv_pairs}: expected 1 <= "
                             f"4·num_kv_pairs <= seq_len={self.seq_len}")
        if self.num_kv_pairs > self.vocab_size // 2 - 1:
            raise ValueError(f"{name}.vocab_size={self.vocab_size} is too small for "
                             f"{self.num_kv_pairs} distinct keys (keys are 1..vocab_size/2−1)")
        if not 0 < self.power_a <= 1:
            raise ValueError(f"{name}.power_a={self.power_a}: expected a value in (0, 1]")

    def source(self, split: str, seed: int) -> MQARSource:
        return MQARSource(self, split, seed)


class MQARSource(SyntheticSource):
    """Random-access MQAR examples; example i of a split depends only on (seed, split, i)."""

    def __init__(self, config: MQARConfig, split: str, seed: int):
        super().__init__(config, split, seed)
        space = (config.seq_len - 2 * config.num_kv_pairs) // 2
        gaps = np.arange(1, space + 1, dtype=np.float64)
        weights = config.power_a * gaps ** (config.power_a - 1)
        self._gap_probs = weights / weights.sum()

    def make_example(self, index: int) -> dict[str, np.ndarray]:
        c = self.config
        rng = example_rng(self.seed, self.split, index)
        half = c.vocab_size // 2
        keys = rng.choice(np.arange(1, half), c.num_kv_pairs, replace=False)
        values = rng.choice(np.arange(half, c.vocab_size), c.num_kv_pairs, replace=False)
        context = 2 * c.num_kv_pairs
        gaps = rng.choice(len(self._gap_probs), c.num_kv_pairs, replace=False, p=self._gap_probs)
        inputs = np.zeros(c.seq_len, np.int32)
        inputs[0:context:2], inputs[1:context:2] = keys, values
        query_positions = context + 2 * gaps
        inputs[query_positions] = keys
        targets = np.zeros(c.seq_len, np.int32)
        targets[query_positions] = values
        mask = np.zeros(c.seq_len, bool)
        mask[query_positions] = True
        if c.random_non_queries:
            empty = inputs == 0
            inputs[empty] = rng.integers(0, c.vocab_size, int(empty.sum()))
        return {"inputs": inputs, "targets": targets, "mask": mask}
