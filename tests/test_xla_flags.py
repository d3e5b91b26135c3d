"""`hybrid_jax.xla_flags`: the XLA:CPU fusion fault's flag is set for the checked jaxlib versions
and, for any other, only where XLA takes it (asked once in a subprocess and cached), since an
unknown flag in XLA_FLAGS aborts the process (jaxlib 0.11.2 has the fault; whether it kept
the flag was not known)."""

import json
import os
import subprocess

import jaxlib
import pytest

from hybrid_jax import xla_flags


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_xla_is_asked_once_per_version_and_setting(cache_home, monkeypatch):
    # This jaxlib (0.10) knows the flag; no XLA knows a made-up one.
    assert xla_flags.xla_knows(xla_flags._SETTING)
    assert not xla_flags.xla_knows("--xla_no_such_flag=true")
    cached = json.loads((cache_home / "hybrid_jax" / "xla_flags.json").read_text())
    assert cached == {f"{jaxlib.__version__} {xla_flags._SETTING}": True,
                      f"{jaxlib.__version__} --xla_no_such_flag=true": False}

    def no_subprocess(*args, **kwargs):
        raise AssertionError("asked again")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert xla_flags.xla_knows(xla_flags._SETTING)  # from the cache


@pytest.mark.parametrize("knows", [True, False])
def test_an_unchecked_version_gets_the_flag_only_where_xla_takes_it(knows, monkeypatch):
    from jax._src import xla_bridge

    monkeypatch.setattr(jaxlib, "__version__", "0.11.2")
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    monkeypatch.setattr(xla_flags, "xla_knows", lambda setting: knows)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    xla_flags.exclude_faulty_cpu_fusion()
    expected = "--xla_force_host_platform_device_count=8" + (
        f" {xla_flags._SETTING}" if knows else "")
    assert os.environ["XLA_FLAGS"] == expected
