"""Needle in a haystack: marked key–value needles in filler, one of them queried at the end.

Filler tokens, with `num_needles` needles `[NEEDLE, key, value]` (distinct keys; RULER's
multi-key NIAH when there are several) each starting at a random depth (a fraction of the
space before the query, drawn uniformly from `[min_depth, max_depth]`; the needles keep their
depth order and never overlap), and the query `[QUERY, key]` of one needle, drawn uniformly,
as the last two tokens. The only scored position is the last one; its target is the queried
needle's value. Depth, length and the number of needles are parameters; `eval_min_depth` /
`eval_max_depth` and `eval_seq_len` move the needles or lengthen the haystack at test time.
With one needle the examples are those of the single-needle generator this one extends.

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
    num_needles: int = 1
    eval_seq_len: int | None = None
    eval_min_depth: float | None = None
    eval_max_depth: float | None = None
    num_train_examples: int = 1_000_000
    num_eval_examples: int = 2_048

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("num_filler", "num_keys", "num_values"):
            check_range(name, field, getattr(self, field), 1)
        check_range(name, "num_needles", self.num_needles, 1, self.num_keys)
        # 3 tokens per needle and the 2 query tokens
        check_range(name, "seq_len", self.seq_len, 3 * self.num_needles + 2)
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
        T, n = c.seq_len, c.num_needles
        # Depths place the needles in the space left once the others' 3 tokens are taken out;
        # the i-th (in depth order) then moves right by 3·i, so no two overlap.
        room = T - 2 - 3 * n  # the last start in that space: all needles end before the query
        depths = np.sort(rng.uniform(c.min_depth, c.max_depth, n))
        starts = np.round(depths * room).astype(int) + 3 * np.arange(n)
        keys: list[int] = []
        while len(keys) < n:  # distinct keys, drawn one at a time (one needle: one draw)
            key = c.num_filler + int(rng.integers(c.num_keys))
            if key not in keys:
                keys.append(key)
        values = c.num_filler + c.num_keys + rng.integers(c.num_values, size=n)
        inputs = rng.integers(0, c.num_filler, T).astype(np.int32)
        for start, key, value in zip(starts, keys, values, strict=True):
            inputs[start:start + 3] = c.needle_token, key, value
        queried = int(rng.integers(n))
        inputs[-2:] = c.query_token, keys[queried]
        targets = np.zeros(T, np.int32)
        mask = np.zeros(T, bool)
        targets[-1], mask[-1] = values[queried], True
        return {"inputs": inputs, "targets": targets, "mask": mask}
