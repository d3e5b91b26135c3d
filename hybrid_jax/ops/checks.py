"""Shape and dtype checks for op inputs, raising errors that say what was expected and found."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def check_rank(op: str, name: str, x: jax.Array, layout: str) -> None:
    """Checks that `x` has one axis per letter of `layout`, e.g. layout 'BTHD'."""
    if x.ndim != len(layout):
        raise ValueError(
            f"{op}: {name} must have shape [{','.join(layout)}] (rank {len(layout)}), "
            f"got shape {tuple(x.shape)}"
        )


def check_dims(
    op: str, expected: dict[str, int], **arrays_with_layout: tuple[jax.Array, str]
) -> dict[str, int]:
    """Checks named axis sizes agree across arrays.

    `arrays_with_layout` maps an argument name to (array, layout), e.g. q=(q, 'BTHK').
    `expected` holds sizes already known. Returns the dict of all sizes.
    """
    sizes = dict(expected)
    origin: dict[str, str] = {letter: "given" for letter in sizes}
    for name, (x, layout) in arrays_with_layout.items():
        check_rank(op, name, x, layout)
        for letter, size in zip(layout, x.shape, strict=True):
            if letter == "_":
                continue
            if letter in sizes and sizes[letter] != size:
                raise ValueError(
                    f"{op}: axis {letter} of {name} (shape {tuple(x.shape)}, layout "
                    f"[{','.join(layout)}]) is {size}, but {origin[letter]} says {sizes[letter]}"
                )
            sizes.setdefault(letter, size)
            origin.setdefault(letter, f"{name} (shape {tuple(x.shape)})")
    return sizes


def check_floating(op: str, **arrays: jax.Array | None) -> None:
    for name, x in arrays.items():
        if x is not None and not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{op}: {name} must be a floating-point array, got dtype {x.dtype}")


def check_divides(op: str, what: str, divisor: int, total: int) -> None:
    if divisor <= 0 or total % divisor:
        raise ValueError(f"{op}: {what}: {divisor} does not divide {total}")


def check_choice(op: str, name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise ValueError(f"{op}: {name}={value!r} is not one of {list(allowed)}")
