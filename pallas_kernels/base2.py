"""Exponentials in base 2, as the kernels take them.

On the GPU `jnp.exp` lowers (Triton) to libdevice's range-reduced expf, about 8 instructions
around one `ex2`; `jnp.exp2` is the `ex2.approx` alone. So the kernels write e^x as
2^(x·log₂e) (`exp`), or keep their logits in base 2 from the start (flash attention's and
NHA's window kernels: the logit scale times log₂e). The product's rounding adds a relative
error of at most |x|·2⁻²⁴·log₂e·ln 2 ≈ |x|·6e-8 to e^x (4e-6 at |x| = 60): far below a bf16
or TF32 operand's rounding, and inside the float32 tests' tolerances.

Fewer instructions is not less time everywhere: timed kernel by kernel (session 29, H100), the
SSD's chunk kernels and NHA's `chunk_prepare` ran 5–10 % slower with it and take `jnp.exp`;
take this one where a measurement says it pays.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

LOG2E = math.log2(math.e)


def exp(x: jax.Array) -> jax.Array:
    """e^x as 2^(x·log₂e); exp(−inf) = 0 as with `jnp.exp`."""
    return jnp.exp2(LOG2E * x)
