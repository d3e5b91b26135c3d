"""Random draws of a model's initialisation, compiled fast on one GPU.

JAX lowers the Threefry-2x32 hash behind every random draw to a long chain of integer ops, and
XLA:GPU fuses that chain with the draw's transform (bits → normal → scale) into large kernels
that ptxas compiles slowly: pha-180m's unscanned initialisation did not compile in 140 s on an
H200, one of its fusions alone spending 44 s in ptxas (session 9, BENCHMARKS.md). With
`jax_threefry_gpu_kernel_lowering` the hash runs as jaxlib's CUDA kernel instead: the same
bits, nothing to compile per draw.

The kernel is a custom call that XLA cannot partition, so under a mesh of several devices each
device would hash whole arrays; there the fused lowering stays (a sharded run's initialisation
is one scanned layer's draws in any case).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
from jax.sharding import Mesh

_FLAG = "jax_threefry_gpu_kernel_lowering"


@contextlib.contextmanager
def fast_random_compile(mesh: Mesh | None = None) -> Iterator[bool]:
    """Within the block, jit-compiled random draws on a GPU use the Threefry kernel, when the
    computation runs on one device (`mesh` None or of one device). Yields whether it does; the
    flag's previous value is restored on exit. Compile (call) the jitted function inside."""
    use = jax.default_backend() == "gpu" and (mesh is None or mesh.size == 1)
    previous = getattr(jax.config, _FLAG)
    if use:
        jax.config.update(_FLAG, True)
    try:
        yield use
    finally:
        if use:
            jax.config.update(_FLAG, previous)
