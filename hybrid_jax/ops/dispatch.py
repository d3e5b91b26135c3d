"""Choosing the implementation rung of an op.

Every op takes `implementation=`: a name picks that rung (and fails loudly if it cannot run the
call), `None` picks the first rung, in the op's order (fastest first), that supports the backend
and the shapes, so auto never warns and never fails where the XLA rung works.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

IMPLEMENTATIONS = ("reference", "xla", "pallas", "cudnn")


def _always(*args: Any, **kwargs: Any) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class Rung:
    """One implementation of an op.

    `unsupported(*args, **kwargs)` returns None when this rung can run the call, else the reason.
    `auto=False` keeps a rung (the naive reference) out of automatic selection.
    """

    name: str
    fn: Callable[..., Any]
    unsupported: Callable[..., str | None] = _always
    auto: bool = True


def backend() -> str:
    """The platform the default device runs on: 'cpu', 'gpu' or 'tpu'."""
    return jax.default_backend()


def dispatch(
    op: str, rungs: Sequence[Rung], implementation: str | None, *args: Any, **kwargs: Any
) -> Any:
    if implementation is not None:
        names = [rung.name for rung in rungs]
        if implementation not in names:
            raise ValueError(
                f"{op}: implementation={implementation!r} is not available; expected one of "
                f"{names} or None (auto)"
            )
        rung = rungs[names.index(implementation)]
        reason = rung.unsupported(*args, **kwargs)
        if reason is not None:
            raise ValueError(
                f"{op}: implementation={implementation!r} cannot run this call: {reason}"
            )
        return rung.fn(*args, **kwargs)
    reasons = []
    for rung in rungs:
        if not rung.auto:
            continue
        reason = rung.unsupported(*args, **kwargs)
        if reason is None:
            return rung.fn(*args, **kwargs)
        reasons.append(f"{rung.name}: {reason}")
    raise ValueError(f"{op}: no implementation supports this call ({'; '.join(reasons)})")
