"""Module diagnostics: named values a module reports and the trainer logs, unseen by either.

A module calls `report(self, "name", value)` in its forward pass (e.g. the parallel block's
mixing weights). Outside `recording()` this does nothing, so ordinary calls, eval, decode and
generation never change the model's state. The train step runs the forward pass inside
`recording()` and then `collect(model)` pops every reported value as `{"blocks.3.mixing_gss":
array}` (module path + name); `scalars` flattens arrays to one scalar per element for
`metrics.jsonl` and TensorBoard (logged as `diag/<name>`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

PREFIX = "diag/"


class Diagnostic(nnx.Intermediate):
    """A value a module reported for the trainer's logs (a sown intermediate)."""


_state = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Within this context (at trace time), `report` stores values for `collect`."""
    previous = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = previous


def report(module: nnx.Module, name: str, value: jax.Array) -> None:
    """Reports `value` (a scalar or array) under `name` on `module`; the latest call wins."""
    if getattr(_state, "on", False):
        module.sow(Diagnostic, name, jnp.asarray(value), reduce_fn=lambda _, new: new,
                   init_fn=lambda: None)


def collect(model: nnx.Module) -> dict[str, jax.Array]:
    """Removes the reported values from `model` and returns them by dotted path."""
    popped = nnx.pop(model, Diagnostic)
    out = {}
    for path, value in nnx.to_flat_state(popped):
        out[".".join(str(p) for p in path)] = value.get_value()
    return out


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
