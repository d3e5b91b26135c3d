"""What the experiment drivers write: whole files only, under names that keep numbers apart."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> Path:
    """Writes `text` to `path` through a temporary file renamed over it: a driver killed
    mid-write leaves the previous file (or none), never a torn one that lost the rows before
    it or that the next call cannot read back."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, newline="")  # as given: a CSV's \r\n rows stay \r\n
    os.replace(tmp, path)
    return path


def number_id(value: float) -> str:
    """`value` as a short name that reads back as exactly `value`: `:g` (0.001, 1e-05) where
    that is exact, else `repr`. `:g` alone keeps 6 significant digits, so two learning rates
    differing past them shared one run directory, cell or table column."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
