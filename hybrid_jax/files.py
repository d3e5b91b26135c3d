"""Whole files only: a file is replaced by a complete new one or left as it was.

A write cut short (a full disk, a kill, Ctrl-C) must never leave a torn file that loses what it
held (rows of earlier runs, a tokenizer, metrics) or that the next call cannot read back, nor a
temporary file beside it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def temporary_path(path: str | Path) -> Path:
    """Where `replacing` writes `path` before renaming it: `NAME.tmp` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".tmp")


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (`temporary_path`, its folders created) to write; renamed
    over `path` when the block ends, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
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
