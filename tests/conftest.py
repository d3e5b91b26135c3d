"""Test-suite setup: 8 fake CPU devices (set before jax is imported), cheaper compiles,
garbage collection by test module, a time limit per fast test and float64 helpers."""

import gc
import os
import subprocess
import sys

# Tests are dominated by XLA compile time on tiny shapes: cheaper LLVM passes make the suite
# several times faster, and XLA's classic CPU fusion emitters (instead of the MLIR ones)
# compile another ~40 % faster. No fast-math: results differ from XLA's defaults by rounding
# (a few ulps). The compiled code runs ~3x slower than with the defaults (~1.3x of that from
# the emitters), which tiny shapes do not feel.
CHEAP_CODE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
# Each program's LLVM module compiled in one piece: CI's two cores already run two test
# workers, and splitting a module for parallel codegen only adds threads and the split's work
# (measured on 2 cores, `pytest -n 2` of the delta-rule kernel and shard_map tests: 86 -> 74 s
# and 110 -> 97 s). The generated code is the same kind, so the notebooks' kernels take it too.
COMPILE_FLAGS = ("--xla_cpu_parallel_codegen_split_count=1",)
KNOWN_FLAGS_ENV = "HYBRID_JAX_TESTS_KNOWN_XLA_FLAGS"


def _known_flags(flags: tuple[str, ...]) -> list[str]:
    """`flags` less those the installed XLA does not know. XLA aborts the process at an
    unknown flag in XLA_FLAGS ("Unknown flag in XLA_FLAGS", no Python error: the whole suite
    stopped at once under JAX 0.11, which dropped --xla_cpu_use_fusion_emitters), so they are
    tried in a subprocess first, once a session: the answer reaches the workers in the
    environment."""
    if KNOWN_FLAGS_ENV in os.environ:
        return os.environ[KNOWN_FLAGS_ENV].split()

    def starts(tried) -> bool:
        env = {**os.environ, "XLA_FLAGS": " ".join(tried), "JAX_PLATFORMS": "cpu"}
        return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True, timeout=300).returncode == 0

    known = list(flags) if starts(flags) else [flag for flag in flags if starts([flag])]
    os.environ[KNOWN_FLAGS_ENV] = " ".join(known)
    return known


os.environ["XLA_FLAGS"] = " ".join([
    os.environ.get("XLA_FLAGS", ""),
    "--xla_force_host_platform_device_count=8",
    *_known_flags((*CHEAP_CODE_FLAGS, *COMPILE_FLAGS)),
]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.unrolled_threefry import use_unrolled_threefry  # noqa: E402

use_unrolled_threefry()


# A fast test that hangs (a lost wake-up in a thread, a subprocess that never exits) fails with
# its stack after this long instead of holding CI to its 90-minute limit (the whole fast suite
# takes about 14 minutes on a 2-core machine). `slow` tests keep no limit.
FAST_TEST_LIMIT_S = 600


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FAST_TEST_LIMIT_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each module (its fixtures torn down): collects its garbage, then freezes what
    survives, so that a later `gc.collect()` (the CLI's after a failed command) scans only the
    objects of the running module, not the hundreds of thousands a worker has accumulated
    (a few seconds per call late in the suite)."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        gc.collect()
        gc.freeze()


@pytest.fixture
def x64():
    """Runs the test with 64-bit types enabled (float64 references on CPU)."""
    with jax.enable_x64(True):
        yield
