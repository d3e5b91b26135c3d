"""Experiment definitions; each module registers its experiments on import."""

from experiments.configs import lm, mqar, nha, oryx, pha  # noqa: F401
