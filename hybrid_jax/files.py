"""Whole files only: a file is replaced by a complete new one or left as it was.

A write cut short (a full disk, a kill, Ctrl-C) must never leave a torn file that loses what it
held (rows of earlier runs, a tokenizer, metrics) or that the next call cannot read back, nor a
temporary file beside it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def is_temporary(path: str | Path, of: str) -> bool:
    """Whether `path` is a temporary file of `replacing` for a file named `of` (`NAME.*.tmp`,
    the plain `NAME.tmp` of earlier versions too): one a writer killed before its rename left."""
    name = Path(path).name
    return name.startswith(of + ".") and name.endswith(".tmp")


def new_temporary(path: Path) -> Path:
    """A new empty file of this writer's own beside `path` (`NAME.RANDOM.tmp`): writers of one
    file at once (threads, processes, the hosts of a run) never share one. Created as `open`
    creates a file (0666 less the umask), not 0600 as `tempfile.mkstemp`: it becomes `path`."""
    while True:
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A new temporary path beside `path` (`NAME.RANDOM.tmp`, one per call, its folders
    created) to write; renamed over `path` when the block ends, removed when it raises. The
    file `path` gets its mode from the umask, as a plain write gives it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, text: str) -> Path:
    """Writes `text` (UTF-8, line endings as given: a CSV's \\r\\n rows stay \\r\\n) to `path`
    through `replacing`; returns `path`."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="")
    return Path(path)
