"""Names that keep numbers apart in what the experiment drivers write (whole files:
`hybrid_jax.files.write_atomic`)."""

from __future__ import annotations


def number_id(value: float) -> str:
    """`value` as a short name that reads back as exactly `value`: `:g` (0.001, 1e-05) where
    that is exact, else `repr`. `:g` alone keeps 6 significant digits, so two learning rates
    differing past them shared one run directory, cell or table column."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
