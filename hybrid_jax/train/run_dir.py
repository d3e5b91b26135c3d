"""Run-directory safety: one writer at a time, and no silent overwrite of another run.

`RunLock` holds an exclusive `flock` on `RUN_DIR/.lock` (released by the kernel when the process
dies, so a killed run never leaves a stale lock) and records the holder's pid and what it is
doing there ("training", or writing an imported model).
`prepare_run_dir` refuses to start a fresh run in a directory that holds another run's outputs
unless `force` (then those outputs are removed; a `tokenizer.json` put there for the run is kept),
and removes the temporary files that a run killed mid-write left beside its outputs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import NamedTuple

from hybrid_jax.files import is_temporary

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"
# What a run writes; a fresh run refuses a directory holding any of them (without --force).
RUN_OUTPUTS = ("config.json", "metrics.jsonl", "results.json", "checkpoints", "tensorboard",
               "damaged_checkpoints")


class RunDirError(ValueError):
    """A run directory that is in use, or that holds another run."""


def make_run_dir(run_dir: Path) -> None:
    """Creates `run_dir` (and its parents); a file in its place is named (mkdir said only "File
    exists")."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory: choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)


class RunLock:
    """`with RunLock(run_dir):` — raises RunDirError naming the holder's pid if it is taken.

    `name`, `holder` and `advice`: the lock file, what else holds it and what to do then (a
    sweep's cells take `cell.lock`, held by "another sweep"); `activity`: what this process
    does there, recorded beside its pid for the others' messages."""

    def __init__(self, run_dir: Path, name: str = LOCK_FILE, holder: str = "another run",
                 advice: str = "wait for it to finish, stop it, or choose another --out", *,
                 activity: str = "training"):
        self.path = Path(run_dir) / name
        self.holder, self.advice, self.activity = holder, advice, activity
        self._file = None

    def acquire(self) -> RunLock:
        make_run_dir(self.path.parent)
        file = open(self.path, "a+")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = _holder(file.read())
            file.close()
            doing = f", {holder.activity}" if holder.activity else ""
            raise RunDirError(f"{self.path.parent} is in use by {self.holder} (process "
                              f"{holder.pid}{doing}, lock {self.path}): {self.advice}") from None
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()} {self.activity}")
        file.flush()
        self._file = file
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class LockHolder(NamedTuple):
    pid: str  # "unknown" if it recorded none
    activity: str  # "" from a lock of a version that recorded the pid alone


def _holder(text: str) -> LockHolder:
    pid, _, activity = text.strip().partition(" ")
    return LockHolder(pid or "unknown", activity)


def lock_holder(run_dir: Path, name: str = LOCK_FILE) -> LockHolder | None:
    """Who holds `run_dir`'s lock now (a run training there, an import writing it), else None.
    Creates nothing: a read-only command may ask (its shared lock is taken and dropped at
    once)."""
    try:
        file = open(Path(run_dir) / name)  # noqa: SIM115 (closed below)
    except OSError:
        return None
    with file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(file.read())
        fcntl.flock(file, fcntl.LOCK_UN)
        return None


def run_outputs(run_dir: Path) -> list[str]:
    """The `RUN_OUTPUTS` present in `run_dir`."""
    return [name for name in RUN_OUTPUTS if (run_dir / name).exists()]


def recorded_experiment(run_dir: Path) -> str | None:
    """The experiment name in `run_dir/config.json` (None without one; '?' if unreadable)."""
    path = run_dir / "config.json"
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text()).get("name", "?"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return "?"


def prepare_run_dir(run_dir: Path, name: str, *, resume: bool, force: bool) -> bool:
    """Checks `run_dir` before a run of experiment `name` writes to it (the lock is held);
    returns whether the run resumes.

    Resuming needs a directory of the same experiment (or an empty one). A fresh run needs a
    directory without run outputs; `force` removes them first (and makes a resume of another
    experiment's directory a fresh start).
    """
    _remove_leftover_temporaries(run_dir)
    recorded = recorded_experiment(run_dir)
    if resume:
        if recorded is not None and recorded != name and not force:
            raise RunDirError(f"{run_dir} holds a run of {recorded!r}, not {name!r}: choose "
                              "another --out (or --force to start over there)")
        if recorded is None or recorded == name:
            return True
    present = run_outputs(run_dir)
    if not present:
        return False
    if not force:
        what = f"a run of {recorded!r}" if recorded else "run outputs"
        raise RunDirError(f"{run_dir} already holds {what} ({', '.join(present)}): pass --resume "
                          "to continue it, --force to overwrite it, or choose another --out")
    for item in present:
        _remove(run_dir / item)
    return False


def _remove_leftover_temporaries(run_dir: Path) -> None:
    """Removes the `NAME.RANDOM.tmp` files of `RUN_OUTPUTS` (`hybrid_jax.files`): a write
    killed before its rename (SIGKILL, the OOM killer) leaves one, and under the run lock no
    writer of them is alive."""
    for path in sorted(run_dir.iterdir()):
        if any(is_temporary(path, name) for name in RUN_OUTPUTS):
            _remove(path)
            log.info("removed %s: a temporary file of a write that was killed before it "
                     "finished", path)


def _remove(path: Path) -> None:
    if path.is_dir():
        # ignore_errors: a data-loading thread of a failed start-up may still write under it
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def undo_failed_start(run_dir: Path, *, created: bool = False):
    """Within, a fresh run (no run outputs in `run_dir`) that fails before writing its
    `config.json` (a training start-up: a vocabulary too small for the tokenizer, a batch the
    mesh cannot split; an import or conversion, `write_run`) removes what it wrote there (its
    tokenizer.json, token cache, checkpoints/), so the directory is as the call found it; what
    was there before (a tokenizer.json from `hybrid-jax tokenizer train --out RUN_DIR`) is
    kept. `created`: the call made `run_dir` (and holds its `RunLock`), which then goes too,
    lock file included, unless something else appeared there."""
    fresh, before = not run_outputs(run_dir), set(run_dir.iterdir())
    try:
        yield
    except BaseException:
        if fresh and not (run_dir / "config.json").exists():
            for path in set(run_dir.iterdir()) - before:
                _remove(path)
            if created and {p.name for p in run_dir.iterdir()} <= {LOCK_FILE}:
                # Unlinked while still held: a run starting now makes a new one, no race.
                (run_dir / LOCK_FILE).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # one did, just now
                    run_dir.rmdir()
        raise
