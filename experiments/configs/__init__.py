"""Experiment definitions; each module registers its experiments on import."""

from experiments.configs import lm, mqar  # noqa: F401
