"""2-D matmuls with float32 accumulation, in the three orientations the kernels use (inside
Pallas kernels the operand transposes become the lowering's own, e.g. Triton's `trans`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def mm(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def mm_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ bᵀ."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def mm_tn(a: jax.Array, b: jax.Array) -> jax.Array:
    """aᵀ @ b."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
