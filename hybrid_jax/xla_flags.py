"""XLA flags the library needs before JAX starts its backends (imported first by `hybrid_jax`).

XLA:CPU in jaxlib 0.10 fuses dots, reductions and elementwise ops into YNNPACK kernels, and one
such fusion reads uninitialised memory: the chunked GSA readout of a sequence that fits in one
chunk, under `jit`, with the zero initial state, returned values near 1e30 that changed from run
to run. Leaving reductions out of those fusions (`-reduce`) gives the eager result; so does
turning the fusions off. jaxlib 0.11.2 gets the same case wrong (values near 1e34, seen in
`tests/ops/test_gsa.py` on a device machine, session 49). An unknown flag in `XLA_FLAGS` aborts
the process when a backend starts (XLA's "Unknown flag in XLA_FLAGS", no Python error), so the
flag is set for the versions checked here, and for any other only where XLA takes it: a
subprocess starts JAX's CPU backend with it, once per jaxlib version (the answer kept in the
user's cache directory).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import jaxlib

_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
_SETTING = f"{_FLAG}=-reduce"
_CHECKED = ("0.10.",)  # jaxlib versions where the fault was seen and the flag fixes it

log = logging.getLogger(__name__)


def exclude_faulty_cpu_fusion() -> None:
    """Adds `--xla_cpu_experimental_ynn_fusion_type=-reduce` to `XLA_FLAGS` unless the user set
    that flag or this XLA does not know it; warns if the backends have already started, when
    the flag comes too late."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG in flags or not (jaxlib.__version__.startswith(_CHECKED) or xla_knows(_SETTING)):
        return
    from jax._src import xla_bridge  # no public query of whether the backends started

    if xla_bridge.backends_are_initialized():
        log.warning("JAX started before hybrid_jax was imported, so %s=-reduce (a fault of "
                    "XLA:CPU in jaxlib %s, hybrid_jax/xla_flags.py) is not set: on CPU, set it "
                    "in XLA_FLAGS or import hybrid_jax first", _FLAG, jaxlib.__version__)
        return
    os.environ["XLA_FLAGS"] = f"{flags} {_SETTING}".strip()


def xla_knows(setting: str) -> bool:
    """Whether this jaxlib's XLA starts with `setting` in `XLA_FLAGS` (asked once per jaxlib
    version in a subprocess, since an unknown flag aborts the process that reads it)."""
    key, cache = f"{jaxlib.__version__} {setting}", _cache_file()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known.get(key), bool):
        known[key] = _starts_with(setting)
        try:  # a cache that cannot be written: asked again next time
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(cache)
        except OSError:
            pass
    return known[key]


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "hybrid_jax" / "xla_flags.json"


def _starts_with(setting: str) -> bool:
    env = {**os.environ, "XLA_FLAGS": setting, "JAX_PLATFORMS": "cpu"}
    try:
        return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
