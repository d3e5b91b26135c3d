"""A name for what a kernel's backward keeps, so a remat policy can save it.

Each kernel's `custom_vjp` forward tags its outputs and the residuals it computes (not its
inputs) with `checkpoint_name(·, KERNEL_RESIDUALS)`. Under `jax.checkpoint` with
`jax.checkpoint_policies.save_only_these_names(KERNEL_RESIDUALS)` the backward then finds them
saved and does not run the forward kernels again: everything else in the block (projections,
norms, gates) is recomputed as under a full remat. Without a policy naming them the tags do
nothing.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.ad_checkpoint import checkpoint_name

KERNEL_RESIDUALS = "kernel_residuals"


def saved(*trees: Any) -> tuple:
    """`trees` with every array leaf tagged as a kernel residual (None and other leaves pass)."""
    tag = lambda x: checkpoint_name(x, KERNEL_RESIDUALS) if isinstance(x, jax.Array) else x
    return tuple(jax.tree.map(tag, tree) for tree in trees)
