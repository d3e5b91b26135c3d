"""Needle in a haystack: a marked key–value needle in filler, queried at the end.

Filler tokens, with the needle `[NEEDLE, key, value]` starting at a random depth (a fraction
of the space before the query, drawn uniformly from `[min_depth, max_depth]`), and the query
`[QUERY, key]` as the last two tokens. The only scored position is the last one; its target is
the needle's value. Depth and length are parameters; `eval_min_depth` / `eval_max_depth` and
`eval_seq_len` move the needle or lengthen the haystack at test time.

Vocabulary: filler `0..num_filler−1`, keys, values, then the NEEDLE and QUERY markers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_jax.config import register_data
from hybrid_jax.data.synthetic import example_rng
from hybrid_jax.data.tasks.common import TaskSource, check_eval_fields, check_range


@register_data("needle")
@dataclasses.dataclass(frozen=True)
class NeedleConfig:
    num_filler: int = 16
    num_keys: int = 8
    num_values: int = 8
    seq_len: int = 100
    min_depth: float = 0.0  # needle start, as a fraction of the positions before the query
    max_depth: float = 1.0
    eval_seq_len: int | None = None
    eval_min_depth: float | None = None
    eval_max_depth: float | None = None
    num_train_examples: int = 1_000_000
    num_eval_examples: int = 2_048

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("num_filler", "num_keys", "num_values"):
            check_range(name, field, getattr(self, field), 1)
        check_range(name, "seq_len", self.seq_len, 5)
        check_range(name, "min_depth", self.min_depth, 0.0, 1.0)
        check_range(name, "max_depth", self.max_depth, self.min_depth, 1.0)
        check_eval_fields(self)

    @property
    def needle_token(self) -> int:
        return self.num_filler + self.num_keys + self.num_values

    @property
    def query_token(self) -> int:
        return self.needle_token + 1

    @property
    def vocab_size(self) -> int:
        return self.needle_token + 2

    def source(self, split: str, seed: int) -> NeedleSource:
        return NeedleSource(self, split, seed)


class NeedleSource(TaskSource):
    """Random-access examples; example i of a split depends only on (seed, split, i)."""

    def make_example(self, index: int) -> dict[str, np.ndarray]:
        c = self.task
        rng = example_rng(self.seed, self.split, index)
        T = c.seq_len
        last_start = T - 5  # the needle's 3 tokens end before the 2 query tokens
        start = int(round(rng.uniform(c.min_depth, c.max_depth) * last_start))
        key = c.num_filler + int(rng.integers(c.num_keys))
        value = c.num_filler + c.num_keys + int(rng.integers(c.num_values))
        inputs = rng.integers(0, c.num_filler, T).astype(np.int32)
        inputs[start:start + 3] = c.needle_token, key, value
        inputs[-2:] = c.query_token, key
        targets = np.zeros(T, np.int32)
        mask = np.zeros(T, bool)
        targets[-1], mask[-1] = value, True
        return {"inputs": inputs, "targets": targets, "mask": mask}
