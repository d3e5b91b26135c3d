"""The named experiments: `names()`, `get(name)`, `register(name)`.

Experiment modules under `experiments/configs/` register on import. Sweeps (grids of runs,
`python -m experiments.run SWEEP --out DIR`) register with `register_sweep`; the expressivity
study's are in `experiments/expressivity/tables.py`. Both are `hybrid_jax.registry.Registry`s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybrid_jax.config import ExperimentConfig
from hybrid_jax.registry import Registry

_LOAD = ("experiments.configs", "experiments.expressivity.tables")
EXPERIMENTS = Registry("experiment", load=_LOAD)
SWEEPS = Registry("sweep", load=_LOAD)


def register(name: str) -> Callable:
    """Decorator for a zero-argument function returning an ExperimentConfig named `name`."""
    if name in SWEEPS._entries:
        raise ValueError(f"experiment {name!r} is already registered as a sweep")
    return EXPERIMENTS.decorator(name)


def register_sweep(name: str) -> Callable:
    """Decorator for a zero-argument function returning a sweep named `name` (an object with
    `name` and `description`, e.g. `experiments.expressivity.sweep.Sweep`).

    A name is an experiment's or a sweep's, never both (`python -m experiments.run NAME` would
    run the sweep): whichever registers second is refused, in either import order."""
    if name in EXPERIMENTS._entries:
        raise ValueError(f"sweep {name!r} is already registered as an experiment")
    return SWEEPS.decorator(name)


def _named(registry: Registry, name: str) -> Any:
    value = registry.get(name)()
    if value.name != name:
        raise ValueError(f"{registry.kind} registered as {name!r} calls itself {value.name!r}")
    return value


def names() -> list[str]:
    return EXPERIMENTS.names()


def get(name: str) -> ExperimentConfig:
    return _named(EXPERIMENTS, name)


def sweep_names() -> list[str]:
    return SWEEPS.names()


def get_sweep(name: str) -> Any:
    return _named(SWEEPS, name)
