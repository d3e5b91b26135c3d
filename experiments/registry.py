"""The named experiments: `names()`, `get(name)`, `register(name)`.

Experiment modules under `experiments/configs/` register on import.
"""

from __future__ import annotations

from collections.abc import Callable

from hybrid_jax.config import ExperimentConfig

_EXPERIMENTS: dict[str, Callable[[], ExperimentConfig]] = {}


def register(name: str) -> Callable:
    """Decorator for a zero-argument function returning an ExperimentConfig named `name`."""

    def decorate(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
        if name in _EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is already registered")
        _EXPERIMENTS[name] = fn
        return fn

    return decorate


def _load() -> None:
    import experiments.configs  # noqa: F401


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
