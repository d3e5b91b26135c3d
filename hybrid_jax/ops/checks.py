"""Shape and dtype checks for op inputs, raising errors that say what was expected and found."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def check_rank(op: str, name: str, x: jax.Array, layout: str) -> None:
    """Checks that `x` has one axis per letter of `layout`, e.g. layout 'BTHD'."""
    if x.ndim != len(layout):
        raise ValueError(
            f"{op}: {name} must have shape [{','.join(layout)}] (rank {len(layout)}), "
            f"got shape {tuple(x.shape)}"
        )


class _Sizes(dict):
    """Axis sizes by letter, with the array each came from (`origin`, for errors)."""

    origin: dict[str, str]


def check_dims(
    op: str, expected: dict[str, int], **arrays_with_layout: tuple[jax.Array, str]
) -> dict[str, int]:
    """Checks named axis sizes agree across arrays.

    `arrays_with_layout` maps an argument name to (array, layout), e.g. q=(q, 'BTHK').
    `expected` holds sizes already known: a dict returned by an earlier call (its errors then
    name the array each size came from) or plain numbers ("given"). Returns the dict of all
    sizes.
    """
    sizes = _Sizes(expected)
    origin = sizes.origin = {letter: "given" for letter in sizes} | getattr(expected, "origin", {})
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


def check_floating_dtype(op: str, name: str, dtype: jnp.dtype) -> None:
    """A requested output or compute dtype: an integer one would round the result."""
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{op}: {name} must be a floating-point dtype, got {jnp.dtype(dtype)}")


def check_integer(op: str, **arrays: jax.Array | None) -> None:
    for name, x in arrays.items():
        if x is not None and not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{op}: {name} must be integers, got dtype {x.dtype}")


def check_divides(op: str, what: str, divisor: int, total: int) -> None:
    if divisor <= 0 or total % divisor:
        raise ValueError(f"{op}: {what}: {divisor} does not divide {total}")


def check_count(op: str, name: str, value: object, low: int, *, optional: bool = False
                ) -> None:
    """Checks that `value` is a Python or NumPy int (not a bool) >= `low` (`optional`: or
    None): a size, window or length that shapes arrays, where a float or a negative number
    fails deep in a trace."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{op}: {name} must be an int >= {low}{' or None' if optional else ''}"
                         f", got {value!r}")


def check_choice(op: str, name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise ValueError(f"{op}: {name}={value!r} is not one of {list(allowed)}")


def check_ssm_inputs(op: str, x, dt, A, B, C, chunk_size, initial_state, *, dt_layout: str,
                     A_layout: str) -> None:
    """The inputs of a selective state-space op (SSD, the Mamba-1 scan): x `[B, T, H, P]`,
    dt and A in the op's own layouts, B, C `[B, T, G, N]` with G dividing H, a positive int
    chunk size and an optional `[B, H, P, N]` initial state."""
    sizes = check_dims(op, {}, x=(x, "BTHP"), dt=(dt, dt_layout), A=(A, A_layout),
                       B=(B, "BTGN"), C=(C, "BTGN"))
    check_floating(op, x=x, dt=dt, A=A, B=B, C=C, initial_state=initial_state)
    check_divides(op, "num_groups (axis 2 of B and C) must divide num_heads (axis 2 of x)",
                  sizes["G"], sizes["H"])
    if sizes["T"] < 1:
        raise ValueError(f"{op}: x needs at least one time step, got shape {tuple(x.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be a positive int, got {chunk_size!r}")
    if initial_state is not None:
        check_dims(op, sizes, initial_state=(initial_state, "BHPN"))
