"""Damage done to saved checkpoint files by the tests of restores that must refuse them."""

from __future__ import annotations

from pathlib import Path


def largest_array_file(step_dir: Path) -> Path:
    """The biggest array data file of a step directory's `state` item."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file()
             and "METADATA" not in p.name and p.suffix != ".json"]
    return max(files, key=lambda p: p.stat().st_size)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
