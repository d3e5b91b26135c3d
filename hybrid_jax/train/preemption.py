"""Preemption: SIGTERM / SIGINT ask the training loop to checkpoint and stop, not to die.

In a multi-process job a signal may reach only some processes; `everywhere()` makes every
process stop at the same step (a checkpoint needs all of them), taking the first signal name
any process received.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import jax
import numpy as np

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """While active, SIGTERM and SIGINT set `received` (the signal's name) instead of killing the
    process; the loop polls it between steps. A second signal of the same kind acts as usual.
    Outside the main thread (where handlers cannot be installed) it does nothing."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def everywhere(self) -> bool:
        """Whether any process of the job received a signal (then `received` names one)."""
        if jax.process_count() == 1:
            return self.received is not None
        from jax.experimental import multihost_utils

        codes = multihost_utils.process_allgather(
            np.int32(0 if self.received is None else signal.Signals[self.received].value))
        if self.received is None and np.any(codes):
            self.received = signal.Signals(int(codes[np.flatnonzero(codes)[0]])).name
        return self.received is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signum, self._previous[signum])

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
