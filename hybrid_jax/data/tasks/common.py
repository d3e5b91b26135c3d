"""What the expressivity tasks share: a train/eval split of the config and field checks.

Every task config has fields for its training distribution (`seq_len`, a distribution knob
such as `ones_prob`) and, for each, an `eval_<field>` (None: same as training). The eval split
is generated from the config with those overrides applied, so one experiment can train at
length 100 and evaluate at 400 (length generalisation) or under a shifted knob (OOD).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hybrid_jax.data.synthetic import SyntheticSource

EVAL_PREFIX = "eval_"


def split_config(config: Any, split: str) -> Any:
    """The config that generates `split`: for "eval", each `eval_<name>` that is set replaces
    `<name>` (and the `eval_` fields are cleared)."""
    eval_fields = [f.name for f in dataclasses.fields(config) if f.name.startswith(EVAL_PREFIX)]
    if split != "eval":
        return dataclasses.replace(config, **dict.fromkeys(eval_fields))
    changes = {name[len(EVAL_PREFIX):]: getattr(config, name) for name in eval_fields
               if getattr(config, name) is not None}
    return dataclasses.replace(config, **dict.fromkeys(eval_fields), **changes)


def check_eval_fields(config: Any) -> None:
    """Validates the eval distribution by building it (its `__post_init__` runs the checks)."""
    if any(getattr(config, f.name) is not None for f in dataclasses.fields(config)
           if f.name.startswith(EVAL_PREFIX)):
        try:
            split_config(config, "eval")
        except ValueError as e:
            raise ValueError(f"the eval split (eval_* fields) is invalid: {e}") from None


def check_range(owner: str, name: str, value: Any, low: float, high: float | None = None,
                *, optional: bool = False) -> None:
    """Raises ValueError unless `low <= value <= high` (None allowed when `optional`)."""
    if value is None and optional:
        return
    upper = "" if high is None else f" and <= {high}"
    if value is None or not low <= value <= (np.inf if high is None else high):
        raise ValueError(f"{owner}.{name}={value!r}: expected a value >= {low}{upper}"
                         + (" or None" if optional else ""))


class TaskSource(SyntheticSource):
    """A `SyntheticSource` whose examples come from `self.task`, the config of its split."""

    def __init__(self, config: Any, split: str, seed: int):
        super().__init__(config, split, seed)
        self.task = split_config(config, split)
