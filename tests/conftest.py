"""Test-suite setup: 8 fake CPU devices (set before jax is imported) and float64 helpers."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def x64():
    """Runs the test with 64-bit types enabled (float64 references on CPU)."""
    with jax.enable_x64(True):
        yield
