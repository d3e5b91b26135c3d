"""Base of the synthetic-task sources: deterministic, random-access examples.

Every example is a dict of `[seq_len]` arrays: `inputs` (int32 tokens), `targets` (int32, the
token to predict at each position) and `mask` (bool, which positions are scored). Example `i`
of a split depends only on `(seed, split, i)`, so any slice of a dataset can be regenerated
exactly (resumption, sharding, evaluation).
"""

from __future__ import annotations

import abc
import zlib
from typing import Any

import numpy as np

SPLITS = ("train", "eval")


def example_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of one example: independent streams per (seed, split, index)."""
    return np.random.default_rng([seed, zlib.crc32(split.encode()), index])


class SyntheticSource(abc.ABC):
    """A grain random-access source (`__len__`, `__getitem__`) of generated examples.

    The config must have `num_train_examples` and `num_eval_examples`.
    """

    def __init__(self, config: Any, split: str, seed: int):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        self.config, self.split, self.seed = config, split, seed
        self._length = config.num_train_examples if split == "train" else config.num_eval_examples

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self._length:
            raise IndexError(f"example {index} out of range for a {self.split} split of "
                             f"{self._length}")
        return self.make_example(int(index))

    @abc.abstractmethod
    def make_example(self, index: int) -> dict[str, np.ndarray]: ...
