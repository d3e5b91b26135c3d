"""Selective copying with variable distances (Cooper, Diakonikolas, Ma & Sala, 2026).

Each position holds a number token with probability `number_prob`, else an ordinary token.
A number token carries a distance d in `min_distance..max_distance`. At every position t after
a number token, the target is the token d positions back, `x_{t−d}`, where d is the distance of
the most recent number before t; positions before the first number, or with t − d < 0, are not
scored. An SSM layer can hold "the last distance" in a tiny state and a windowed attention layer
(window > max_distance) can fetch `x_{t−d}`; a pure SSM must remember the last `max_distance`
tokens, a pure windowed transformer must see back to the last number.

Vocabulary: ordinary tokens `0..num_tokens−1`, then the number tokens, distance d at
`num_tokens + d − min_distance`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_jax.config import register_data
from hybrid_jax.data.synthetic import example_rng
from hybrid_jax.data.tasks.common import TaskSource, check_eval_fields, check_range


@register_data("selective-copying")
@dataclasses.dataclass(frozen=True)
class SelectiveCopyingConfig:
    num_tokens: int = 16  # ordinary tokens
    min_distance: int = 5
    max_distance: int = 10
    number_prob: float = 0.2  # probability that a position holds a number token
    seq_len: int = 100
    eval_seq_len: int | None = None  # None: seq_len (length generalisation: larger)
    eval_number_prob: float | None = None  # None: number_prob (OOD: another density)
    num_train_examples: int = 1_000_000
    num_eval_examples: int = 2_048

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_range(name, "num_tokens", self.num_tokens, 1)
        check_range(name, "min_distance", self.min_distance, 1)
        check_range(name, "max_distance", self.max_distance, self.min_distance)
        check_range(name, "number_prob", self.number_prob, 0.0, 1.0)
        # Without numbers, or shorter than the shortest distance + 1, no position is ever
        # scored: every example's mask would be empty.
        if self.number_prob == 0:
            raise ValueError(f"{name}.number_prob=0: expected a value > 0 (without number "
                             "tokens no position is scored)")
        check_range(name, "seq_len", self.seq_len, self.min_distance + 1)
        check_eval_fields(self)

    @property
    def vocab_size(self) -> int:
        return self.num_tokens + self.max_distance - self.min_distance + 1

    def number_token(self, distance: int) -> int:
        return self.num_tokens + distance - self.min_distance

    def source(self, split: str, seed: int) -> SelectiveCopyingSource:
        return SelectiveCopyingSource(self, split, seed)


class SelectiveCopyingSource(TaskSource):
    """Random-access examples; example i of a split depends only on (seed, split, i)."""

    def make_example(self, index: int) -> dict[str, np.ndarray]:
        c = self.task
        rng = example_rng(self.seed, self.split, index)
        T = c.seq_len
        is_number = rng.random(T) < c.number_prob
        ordinary = rng.integers(0, c.num_tokens, T)
        numbers = c.number_token(rng.integers(c.min_distance, c.max_distance + 1, T))
        inputs = np.where(is_number, numbers, ordinary).astype(np.int32)
        # The most recent number strictly before each position (−1: none yet).
        last_at_or_before = np.maximum.accumulate(np.where(is_number, np.arange(T), -1))
        last_before = np.concatenate([[-1], last_at_or_before[:-1]])
        distance = inputs[np.maximum(last_before, 0)] - c.num_tokens + c.min_distance
        source = np.arange(T) - distance
        mask = (last_before >= 0) & (source >= 0)
        targets = np.where(mask, inputs[np.clip(source, 0, T - 1)], 0).astype(np.int32)
        return {"inputs": inputs, "targets": targets, "mask": mask}
