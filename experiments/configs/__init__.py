"""Experiment definitions; each module registers its experiments on import."""

from experiments.configs import lm, mqar, nha, pha  # noqa: F401
