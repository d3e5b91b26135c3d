"""Experiment definitions; each module registers its experiments on import."""

from experiments.configs import mqar  # noqa: F401
