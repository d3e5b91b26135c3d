"""Runs a peer script (torch, in its own process) and collects the JSON lines it prints, each as
it arrives: a peer cut off by its time limit (fla's Triton autotuning compiles many variants on
its first calls) still hands over every row it finished."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time


def run_json_lines(command: list[str], timeout: float, *, echo: str = "peer",
                   env: dict[str, str] | None = None) -> tuple[list[dict], str]:
    """`(dicts printed one per line, failure)`: failure is "" when the peer exited 0, else the
    time-out or the tail of its stderr. Each dict is printed (prefixed by `echo`) when it
    arrives; the peer's process group is killed at `timeout` seconds. `env`: variables set
    for the peer on top of this process's environment."""
    lines: queue.Queue[str | None] = queue.Queue()
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   bufsize=1, start_new_session=True,
                                   env=None if env is None else {**os.environ, **env})

        def read():
            for line in process.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        rows, failure = [], ""
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                os.killpg(process.pid, signal.SIGKILL)
                failure = f"timed out after {timeout:.0f} s"
                break
            if line is None:
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
                print(echo, row, flush=True)
        code = process.wait()
        if not failure and code:
            stderr.seek(0)
            failure = f"exit {code}: " + stderr.read()[-400:]
    return rows, failure
