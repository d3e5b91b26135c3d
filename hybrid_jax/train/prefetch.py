"""Host-to-device prefetch: a thread reads the next batches and places them on the mesh while
the device runs the current step, so input never stalls it.

The position of the underlying iterator stays checkpointable: `get_state()` is its state just
after the last batch handed out (not after the batches queued ahead).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any


class DevicePrefetcher:
    """Iterates `put(batch)` for the batches of `iterator`, `depth` of them transferred ahead
    (0: in the caller's thread). `iterator` needs `get_state` / `set_state` (grain)."""

    def __init__(self, iterator: Iterator, put: Callable[[Any], Any], depth: int = 2):
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self.iterator, self.put, self.depth = iterator, put, depth
        self._state = iterator.get_state()
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def _work(self, out: queue.Queue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                batch = self.put(next(self.iterator))
                _offer(out, stop, (batch, self.iterator.get_state(), None))
        except BaseException as error:  # noqa: BLE001  (handed to the consumer, raised there)
            _offer(out, stop, (None, None, error))

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._work, args=(self._queue, self._stop),
                                        daemon=True, name="device-prefetch")
        self._thread.start()

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> Any:
        if self._closed:
            # Reading on would start from where the thread stopped, past the batches it had
            # queued and `close` dropped: a run would silently skip them.
            raise RuntimeError("this DevicePrefetcher is closed: the batches it had read ahead "
                               "were dropped, so reading on would skip them (a new one over an "
                               "iterator set to its get_state() resumes after the last batch "
                               "handed out)")
        if self.depth == 0:
            batch = self.put(next(self.iterator))
            self._state = self.iterator.get_state()
            return batch
        if self._thread is None:
            self._start()
        batch, state, error = self._queue.get()
        if error is not None:
            self._halt()  # the thread has ended: the next call starts another, as depth 0 reads on
            raise error
        self._state = state
        return batch

    def get_state(self) -> Any:
        return self._state

    def set_state(self, state: Any) -> None:
        self._halt()
        self.iterator.set_state(state)
        self._state = state

    def close(self) -> None:
        """Stops the thread; batches queued ahead are dropped (the state is kept, `get_state`
        still answers). A later `next` raises: it would read on past the dropped batches."""
        self._closed = True
        self._halt()

    def _halt(self) -> None:
        """Stops the thread, its queued batches dropped; the next `next` starts another one
        where the iterator stands (after `set_state`: the state set)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


def _offer(out: queue.Queue, stop: threading.Event, item: Any) -> None:
    """Queues `item` unless `stop` is set first: a full queue whose consumer has stopped
    reading (`close`, `set_state`) must not block the thread, or their `join` would hang."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue
