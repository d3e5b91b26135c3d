"""XLA flags the library needs before JAX starts its backends (imported first by `hybrid_jax`).

XLA:CPU in jaxlib 0.10 fuses dots, reductions and elementwise ops into YNNPACK kernels, and one
such fusion reads uninitialised memory: the chunked GSA readout of a sequence that fits in one
chunk, under `jit`, with the zero initial state, returned values near 1e30 that changed from run
to run. Leaving reductions out of those fusions (`-reduce`) gives the eager result; so does
turning the fusions off. The flag exists from jaxlib 0.10 on, so it is set only for the versions
checked here: an unknown flag in `XLA_FLAGS` aborts the backend's start.
"""

from __future__ import annotations

import logging
import os

import jaxlib

_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
_CHECKED = ("0.10.",)  # jaxlib versions where the fault was seen and the flag fixes it

log = logging.getLogger(__name__)


def exclude_faulty_cpu_fusion() -> None:
    """Adds `--xla_cpu_experimental_ynn_fusion_type=-reduce` to `XLA_FLAGS` unless the user set
    that flag; warns if the backends have already started, when the flag comes too late."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not jaxlib.__version__.startswith(_CHECKED) or _FLAG in flags:
        return
    from jax._src import xla_bridge  # no public query of whether the backends started

    if xla_bridge.backends_are_initialized():
        log.warning("JAX started before hybrid_jax was imported, so %s=-reduce (a fault of "
                    "XLA:CPU in jaxlib %s, hybrid_jax/xla_flags.py) is not set: on CPU, set it "
                    "in XLA_FLAGS or import hybrid_jax first", _FLAG, jaxlib.__version__)
        return
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}=-reduce".strip()
