"""Preemption: SIGTERM / SIGINT ask the training loop to checkpoint and stop, not to die; a
watchdog makes sure the process ends within seconds even when the loop cannot get there.

Python runs signal handlers on the main thread between bytecodes, so a main thread blocked in a
device computation (waiting in `jax.device_get`) never sees the signal. The C-level handler
still writes the signal number to the wakeup fd (`signal.set_wakeup_fd`); a watchdog thread
reads it, sets `received`, and — when the loop has not acknowledged the stop within
`grace_s`, or on a second signal — calls `on_force_exit` (flush logs, say what was saved) and
ends the process with status 128 + signal.

In a multi-process job a signal may reach only some processes; `everywhere()` makes every
process stop at the same step (a checkpoint needs all of them), taking the first signal name
any process received.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

import jax
import numpy as np

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# `timeout` (coreutils) signals the process and then its process group: a multithreaded process
# may take that one stop as two deliveries, microseconds apart. Within this window, a repeat of
# the first signal is that copy, not a second signal.
DUPLICATE_S = 0.1


class StopSignals:
    """While active, SIGTERM and SIGINT set `received` (the signal's name) instead of killing
    the process; the loop polls it between steps and calls `acknowledge()` once it is stopping.

    If nothing acknowledges within `grace_s` seconds, or a second signal arrives before the run
    stops, `on_force_exit(signal_name)` runs on the watchdog thread (it must be quick: flush and
    describe what is on disk; its text is printed) and the process exits with 128 + signal.
    Outside the main thread (where handlers cannot be installed) it does nothing.
    """

    def __init__(self, grace_s: float = 10.0,
                 on_force_exit: Callable[[str], str] | None = None):
        self.received: str | None = None
        self.grace_s, self.on_force_exit = grace_s, on_force_exit
        self._previous: dict[int, object] = {}
        self._previous_fd = -1
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        self._stopping = threading.Event()  # acknowledged by the loop, or the context is left
        self._acknowledged = False
        self._watchdog: threading.Thread | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._sockets = (reader, writer)
        self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._watchdog = threading.Thread(target=self._watch, args=(reader,),
                                          name="stop-signal-watchdog", daemon=True)
        self._watchdog.start()
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
        # Runs on the main thread when it is free; the watchdog has usually seen it already.
        self.received = self.received or signal.Signals(signum).name

    def acknowledge(self) -> None:
        """The loop has seen `received` and is checkpointing: no forced exit on a timeout (a
        second signal still forces one)."""
        self._acknowledged = True
        self._stopping.set()

    def deliver_late(self) -> None:
        """After the context: a signal that came when the loop no longer looked (during the
        final checkpoint or evaluation) stopped nothing; it is raised again, now for the
        handlers the context restored (SIGINT: KeyboardInterrupt; SIGTERM by default ends the
        process), so that a caller going on to other work stops as it was asked to."""
        if self.received is not None and not self._acknowledged:
            signal.raise_signal(signal.Signals[self.received])

    def _watch(self, reader: socket.socket) -> None:
        first = self._read_signal(reader, None)
        if first is None:
            return
        self.received = self.received or first.name
        second = self._read_second(reader, first, time.monotonic(), self.grace_s)
        if second is None and (self._stopping.is_set() or self._sockets is None):
            second = self._read_signal(reader, None)  # stopping cleanly: only a 2nd signal
            if second is None:
                return
        self._force_exit(second or first, timed_out=second is None)

    def _read_second(self, reader: socket.socket, first: signal.Signals, first_at: float,
                     timeout: float) -> signal.Signals | None:
        """The next signal within `timeout`, skipping a copy of `first` that came within
        DUPLICATE_S of it."""
        deadline = time.monotonic() + timeout
        while True:
            sig = self._read_signal(reader, max(0.0, deadline - time.monotonic()))
            if sig != first or time.monotonic() - first_at >= DUPLICATE_S:
                return sig

    def _read_signal(self, reader: socket.socket, timeout: float | None
                     ) -> signal.Signals | None:
        """The next caught signal, None on timeout or when the context closes the socket."""
        while True:
            try:  # the socket may be closed under us when the context exits
                reader.settimeout(timeout)
                data = reader.recv(1)
            except (TimeoutError, OSError):
                return None
            if not data:
                return None
            try:
                sig = signal.Signals(data[0])
            except ValueError:
                continue
            if sig in SIGNALS:
                return sig

    def _force_exit(self, sig: signal.Signals, *, timed_out: bool) -> None:
        why = (f"the run did not stop within {self.grace_s:g} s of {self.received} (stuck in a "
               "device computation?)" if timed_out else f"second signal ({sig.name})")
        saved = ""
        if self.on_force_exit is not None:
            try:
                saved = self.on_force_exit(sig.name)
            except Exception as e:  # the exit must happen whatever the flush does
                saved = f"could not flush the logs: {type(e).__name__}: {e}"
        print(f"{why}: exiting now with status {128 + sig.value}. {saved}".strip(),
              file=sys.stderr, flush=True)
        os._exit(128 + sig.value)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._sockets is not None:
            signal.set_wakeup_fd(self._previous_fd)
            reader, writer = self._sockets
            self._sockets = None
            self._stopping.set()
            writer.close()
            reader.shutdown(socket.SHUT_RDWR)
            reader.close()
        if self._watchdog is not None:
            self._watchdog.join(timeout=1.0)
            self._watchdog = None
