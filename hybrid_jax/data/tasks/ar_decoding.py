"""Associative recall with decoding: the query word is given as a binary code.

A body of random word tokens (`2^num_bits` words), then a query marker and `num_bits` bit
tokens spelling the index of a query word (most significant bit first). The only scored
position is the last one: its target is the token that followed the query word's last
occurrence in the body. The query word always occurs in the body with a successor (it is
planted at a random position when the random body lacks it).

Solving it takes two steps: decode the bits into a word (local and positional, cheap for an
SSM) and retrieve by content over the whole body (cheap for attention).

The OOD knob `ones_prob` is the probability of a one in each bit of the query code (0.5:
uniform over words); `eval_ones_prob` shifts it at test time.

Vocabulary: words `0..2^num_bits−1`, then the bit tokens 0 and 1, then the query marker.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_jax.config import register_data
from hybrid_jax.data.synthetic import example_rng
from hybrid_jax.data.tasks.common import TaskSource, check_eval_fields, check_range


@register_data("ar-decoding")
@dataclasses.dataclass(frozen=True)
class ARDecodingConfig:
    num_bits: int = 5
    seq_len: int = 100  # body + query marker + bits
    ones_prob: float = 0.5  # P(bit = 1) in the query code
    eval_seq_len: int | None = None  # None: seq_len
    eval_ones_prob: float | None = None  # None: ones_prob
    num_train_examples: int = 1_000_000
    num_eval_examples: int = 2_048

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_range(name, "num_bits", self.num_bits, 1, 16)
        check_range(name, "seq_len", self.seq_len, self.num_bits + 3)
        check_range(name, "ones_prob", self.ones_prob, 0.0, 1.0)
        check_eval_fields(self)

    @property
    def num_words(self) -> int:
        return 2 ** self.num_bits

    @property
    def bit_tokens(self) -> tuple[int, int]:
        return self.num_words, self.num_words + 1

    @property
    def query_token(self) -> int:
        return self.num_words + 2

    @property
    def vocab_size(self) -> int:
        return self.num_words + 3

    def source(self, split: str, seed: int) -> ARDecodingSource:
        return ARDecodingSource(self, split, seed)


class ARDecodingSource(TaskSource):
    """Random-access examples; example i of a split depends only on (seed, split, i)."""

    def make_example(self, index: int) -> dict[str, np.ndarray]:
        c = self.task
        rng = example_rng(self.seed, self.split, index)
        body_len = c.seq_len - c.num_bits - 1
        bits = (rng.random(c.num_bits) < c.ones_prob).astype(np.int32)
        word = int(bits @ (2 ** np.arange(c.num_bits - 1, -1, -1)))
        body = rng.integers(0, c.num_words, body_len).astype(np.int32)
        occurrences = np.flatnonzero(body[:-1] == word)
        if occurrences.size == 0:
            body[rng.integers(0, body_len - 1)] = word
            occurrences = np.flatnonzero(body[:-1] == word)
        inputs = np.concatenate([body, [c.query_token], c.bit_tokens[0] + bits]).astype(np.int32)
        targets = np.zeros(c.seq_len, np.int32)
        mask = np.zeros(c.seq_len, bool)
        targets[-1], mask[-1] = body[occurrences[-1] + 1], True
        return {"inputs": inputs, "targets": targets, "mask": mask}
