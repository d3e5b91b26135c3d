"""Preemption: SIGTERM / SIGINT ask the training loop to checkpoint and stop, not to die."""

from __future__ import annotations

import signal
import threading
from types import FrameType

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

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signum, self._previous[signum])

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
