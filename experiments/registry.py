"""The named experiments: `names()`, `get(name)`, `register(name)`.

Experiment modules under `experiments/configs/` register on import. Sweeps (grids of runs,
`python -m experiments.run SWEEP --out DIR`) register with `register_sweep`; the expressivity
study's are in `experiments/expressivity/tables.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybrid_jax.config import ExperimentConfig

_EXPERIMENTS: dict[str, Callable[[], ExperimentConfig]] = {}
_SWEEPS: dict[str, Callable[[], Any]] = {}


def register(name: str) -> Callable:
    """Decorator for a zero-argument function returning an ExperimentConfig named `name`."""

    def decorate(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
        if name in _EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is already registered")
        _EXPERIMENTS[name] = fn
        return fn

    return decorate


def register_sweep(name: str) -> Callable:
    """Decorator for a zero-argument function returning a sweep named `name` (an object with
    `name` and `description`, e.g. `experiments.expressivity.sweep.Sweep`)."""

    def decorate(fn: Callable[[], Any]) -> Callable[[], Any]:
        if name in _SWEEPS or name in _EXPERIMENTS:
            raise ValueError(f"sweep {name!r} is already registered")
        _SWEEPS[name] = fn
        return fn

    return decorate


def _load() -> None:
    import experiments.configs  # noqa: F401
    import experiments.expressivity.tables  # noqa: F401


def names() -> list[str]:
    _load()
    return sorted(_EXPERIMENTS)


def get(name: str) -> ExperimentConfig:
    _load()
    if name not in _EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; available experiments: {names()}")
    experiment = _EXPERIMENTS[name]()
    if experiment.name != name:
        raise ValueError(f"experiment registered as {name!r} calls itself {experiment.name!r}")
    return experiment


def sweep_names() -> list[str]:
    _load()
    return sorted(_SWEEPS)


def get_sweep(name: str) -> Any:
    _load()
    if name not in _SWEEPS:
        raise ValueError(f"unknown sweep {name!r}; available sweeps: {sweep_names()}")
    sweep = _SWEEPS[name]()
    if sweep.name != name:
        raise ValueError(f"sweep registered as {name!r} calls itself {sweep.name!r}")
    return sweep
