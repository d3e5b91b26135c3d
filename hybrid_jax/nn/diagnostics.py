"""Module diagnostics: named values a module reports and the trainer logs, unseen by either.

A module calls `report(self, "name", value)` in its forward pass (e.g. the parallel block's
mixing weights). Outside `recorded` this does nothing, so ordinary calls, eval, decode and
generation never change the model's state. The train step runs its forward pass through
`recorded(forward, model)`, which returns every reported value beside the output as
`{"blocks.3.mixing_gss": array}` (module path + name; through `nnx.capture`, nothing is stored
on the model); `scalars` flattens arrays to one scalar per element for `metrics.jsonl` and
TensorBoard (logged as `diag/<name>`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

PREFIX = "diag/"
M = TypeVar("M", bound=nnx.Module)
R = TypeVar("R")


class Diagnostic(nnx.Intermediate):
    """A value a module reported for the trainer's logs (a sown intermediate)."""


_state = threading.local()


def recorded(forward: Callable[[M], R], model: M) -> tuple[R, dict[str, jax.Array]]:
    """`forward(model)` and the values its modules reported during it, by dotted path."""
    previous = recording()
    _state.on = True  # report() sows only here: flax deprecates a sow outside nnx.capture
    try:
        out, captured = nnx.capture(forward, Diagnostic)(model)
    finally:
        _state.on = previous
    return out, {".".join(str(p) for p in path): value.get_value()
                 for path, value in nnx.to_flat_state(captured)}


def recording() -> bool:
    """Whether a `recorded` call is running (its modules' reports are kept)."""
    return getattr(_state, "on", False)


def report(module: nnx.Module, name: str, value: jax.Array) -> None:
    """Reports `value` (a scalar or array) under `name` on `module`; the latest call wins."""
    if recording():
        module.sow(Diagnostic, name, jnp.asarray(value), reduce_fn=lambda _, new: new,
                   init_fn=lambda: None)


def scalars(values: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One scalar per element: `diag/NAME` for scalars, `diag/NAME/i` for array elements."""
    out = {}
    for name, value in values.items():
        if value.ndim == 0:
            out[PREFIX + name] = value
        else:
            for i, element in enumerate(value.reshape(-1)):
                out[f"{PREFIX}{name}/{i}"] = element
    return out
