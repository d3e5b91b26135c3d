"""Pieces shared by the GPU kernels that stream rows of channels (`short_conv`, `rms_norm`):
the sigmoid on one `ex2.approx`, index tiles, and the reason a call cannot run on them; and
the tile checks of their `BlockSizes` (also flash attention's)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import target
from pallas_kernels.base2 import LOG2E

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def iota(shape, axis):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def sigmoid(z):
    # exp2 is one `ex2.approx` on the GPU (`base2`).
    return 1.0 / (1.0 + jnp.exp2(-LOG2E * z))


class TileChecks:
    """A frozen-dataclass `BlockSizes` base: its `TILES` fields must be powers of two of at
    least `MIN_TILE`, its `COUNTS` fields ≥ 1; `changed()` lists the fields that differ from
    the defaults."""

    TILES: tuple[str, ...] = ()
    COUNTS: tuple[str, ...] = ()
    MIN_TILE: int = 1

    def __post_init__(self):
        least = f" >= {self.MIN_TILE}" if self.MIN_TILE > 1 else ""
        for name in self.TILES:
            value = getattr(self, name)
            if value < self.MIN_TILE or value & (value - 1):
                raise ValueError(f"BlockSizes.{name} must be a power of two{least}, got {value}")
        for name in self.COUNTS:
            if getattr(self, name) < 1:
                raise ValueError(f"BlockSizes.{name} must be >= 1, got {getattr(self, name)}")

    def changed(self) -> dict:
        """The fields that differ from the class defaults (for tables and for pasting)."""
        base = type(self)()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(base, f.name)}


def unsupported_arrays(arrays: dict[str, jax.Array | None], interpret: bool) -> str | None:
    """Why these named arrays (None: absent) cannot go to the kernels, or None: floating
    dtypes; on the GPU (unless interpreted) one of `DTYPES`."""
    for name, array in arrays.items():
        if array is not None and not jnp.issubdtype(array.dtype, jnp.floating):
            return f"{name} must be floating, got {array.dtype}"
    if interpret:
        return None
    if target.platform() != "gpu":
        return (f"the kernels run on GPUs (Triton lowering), the target platform is "
                f"{target.platform()} (interpret=True runs them on the CPU)")
    for name, array in arrays.items():
        if array is not None and array.dtype not in DTYPES:
            return f"{name} has dtype {array.dtype}; the kernels take bfloat16, float16, float32"
    return None
