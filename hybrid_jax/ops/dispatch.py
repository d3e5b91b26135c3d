"""Choosing the implementation rung of an op.

Every op takes `implementation=`: a name picks that rung (and fails loudly if it cannot run the
call), `None` picks the first rung, in the op's order (fastest first), that supports the backend
and the shapes, so auto never fails where the XLA rung works. On an accelerator, when auto passes
over a faster rung, it logs once per op, shape and rung which rung ran and why the faster ones
could not (a warning when a kernel refused and the XLA rung ran; information when the rung
passed over is another XLA form, as DSS's convolution that cannot restart at documents):
no silent fallback.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from pallas_kernels import target
from pallas_kernels.residuals import KERNEL_RESIDUALS  # noqa: F401  (for `remat="kernels"`)

IMPLEMENTATIONS = ("reference", "xla", "pallas", "cudnn", "splash")
KERNELS = ("pallas", "cudnn", "splash")  # the rungs that are not XLA programs
logger = logging.getLogger("hybrid_jax.dispatch")
_LOGGED: set[tuple] = set()


def _always(*args: Any, **kwargs: Any) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class Rung:
    """One implementation of an op.

    `unsupported(*args, **kwargs)` returns None when this rung can run the call, else the reason.
    `auto=False` keeps a rung (the naive reference) out of automatic selection; `auto_platforms`
    limits automatic selection to those platforms (a kernel measured on some only; `()`: a
    kernel tested in interpret mode that has not yet run on an accelerator, whose fallback is
    then logged with that reason), while a named `implementation=` still runs it wherever it is
    supported. `platforms`: the only ones it runs on at all (cuDNN on GPUs, a TPU kernel);
    elsewhere auto passes over it without a word, since it is no faster rung there, and its
    `unsupported` says why to a named call. `applies(*args, **kwargs)`: for a rung that runs a
    special case of the op (NHA whose slots never enter the softmax is causal attention):
    auto passes over it without a word where the case does not arise, as it is no faster
    rung for those calls; where it arises, `unsupported` may still refuse (and is logged).
    """

    name: str
    fn: Callable[..., Any]
    unsupported: Callable[..., str | None] = _always
    auto: bool = True
    auto_platforms: tuple[str, ...] | None = None
    platforms: tuple[str, ...] | None = None
    applies: Callable[..., bool] | None = None


def backend() -> str:
    """The platform the call is traced for: 'cpu', 'gpu' or 'tpu' (the default device's, or
    the device the abstract mesh names: `pallas_kernels.target.platform`)."""
    return target.platform()


def choose(op: str, rungs: Sequence[Rung], implementation: str | None, *args: Any,
           **kwargs: Any) -> tuple[Rung, list[str]]:
    """The rung that runs this call, and the reasons of the faster auto rungs that could not,
    each `"NAME: why"`."""
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
        return rung, []
    reasons = []
    for rung in rungs:
        if not rung.auto or (rung.platforms is not None and backend() not in rung.platforms):
            continue
        if rung.applies is not None and not rung.applies(*args, **kwargs):
            continue
        if rung.auto_platforms is not None and backend() not in rung.auto_platforms:
            where = (f"only on {', '.join(rung.auto_platforms)}" if rung.auto_platforms
                     else "on no platform yet: not yet run on one")
            reasons.append(f"{rung.name}: not chosen automatically on {backend()} ({where}; "
                           f"implementation={rung.name!r} runs it)")
            continue
        reason = rung.unsupported(*args, **kwargs)
        if reason is None:
            return rung, reasons
        reasons.append(f"{rung.name}: {reason}")
    raise ValueError(f"{op}: no implementation supports this call ({'; '.join(reasons)})")


def _shapes(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    return tuple((name, tuple(x.shape), str(x.dtype)) for name, x in
                 [*enumerate(args), *kwargs.items()] if hasattr(x, "shape"))


def log_once(key: tuple, level: int, message: str, *args: Any) -> None:
    """Logs `message % args` on the dispatcher's logger the first time `key` comes."""
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    logger.log(level, message, *args)


def _log_fallback(op: str, rung: Rung, reasons: list[str], shapes: tuple) -> None:
    if not reasons or backend() == "cpu":
        return
    kernel_refused = any(reason.partition(":")[0] in KERNELS for reason in reasons)
    level = logging.WARNING if rung.name == "xla" and kernel_refused else logging.INFO
    described = ", ".join(f"{n}{list(s)} {d}" for n, s, d in shapes)
    # The reasons too: a second reason at the same shapes (a window, causal) is news.
    log_once((op, rung.name, shapes, tuple(reasons)), level, "%s: ran the %s rung for %s; "
             "faster rungs could not: %s", op, rung.name, described, "; ".join(reasons))


def dispatch(
    op: str, rungs: Sequence[Rung], implementation: str | None, *args: Any, **kwargs: Any
) -> Any:
    rung, reasons = choose(op, rungs, implementation, *args, **kwargs)
    _log_fallback(op, rung, reasons, _shapes(args, kwargs))
    return rung.fn(*args, **kwargs)
