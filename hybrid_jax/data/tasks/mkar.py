"""Multi-key associative recall (MKAR): recall keyed by the last `key_len` tokens.

A sequence of random tokens over a small vocabulary. At every position t, the query is the key
formed by the last `key_len` tokens `x_{t−key_len+1..t}`; the target is the token that followed
the most recent earlier occurrence of that key, i.e. `x_{j+1}` for the largest j < t with
`x_{j−key_len+1..j}` equal to the query. Positions whose key has not occurred before are not
scored. With vocabulary 8 and keys of 2 tokens there are 64 keys, so recalls reach far back: a
sliding window sees few of them, and a pure SSM must store a table of 64 key-value entries.

The OOD knob `token_skew` draws tokens with probabilities ∝ (v + 1)^−skew (0: uniform).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_jax.config import register_data
from hybrid_jax.data.synthetic import example_rng
from hybrid_jax.data.tasks.common import TaskSource, check_eval_fields, check_range


@register_data("mkar")
@dataclasses.dataclass(frozen=True)
class MKARConfig:
    vocab_size: int = 8
    key_len: int = 2
    seq_len: int = 100
    token_skew: float = 0.0  # token probabilities ∝ (v + 1)^−token_skew
    eval_seq_len: int | None = None  # None: seq_len
    eval_token_skew: float | None = None  # None: token_skew
    num_train_examples: int = 1_000_000
    num_eval_examples: int = 2_048

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_range(name, "vocab_size", self.vocab_size, 2)
        check_range(name, "key_len", self.key_len, 1)
        check_range(name, "seq_len", self.seq_len, self.key_len + 2)
        check_range(name, "token_skew", self.token_skew, 0.0)
        check_eval_fields(self)

    def token_probs(self) -> np.ndarray:
        weights = np.arange(1, self.vocab_size + 1, dtype=np.float64) ** -self.token_skew
        return weights / weights.sum()

    def source(self, split: str, seed: int) -> MKARSource:
        return MKARSource(self, split, seed)


class MKARSource(TaskSource):
    """Random-access examples; example i of a split depends only on (seed, split, i)."""

    def make_example(self, index: int) -> dict[str, np.ndarray]:
        c = self.task
        rng = example_rng(self.seed, self.split, index)
        T, k = c.seq_len, c.key_len
        inputs = rng.choice(c.vocab_size, T, p=c.token_probs()).astype(np.int32)
        targets = np.zeros(T, np.int32)
        mask = np.zeros(T, bool)
        # A key is the bytes of its k tokens: exact for any vocabulary and key length (a number
        # in base vocab_size overflows int64 once vocab_size^k > 2^63 and merges keys).
        last_end: dict[bytes, int] = {}  # key -> end position of its latest occurrence before t
        for t in range(k - 1, T):
            key = inputs[t - k + 1:t + 1].tobytes()
            j = last_end.get(key)
            if j is not None:
                targets[t], mask[t] = inputs[j + 1], True
            last_end[key] = t
        return {"inputs": inputs, "targets": targets, "mask": mask}
