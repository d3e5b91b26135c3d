"""`fast_random_compile`: the Threefry kernel lowering for one GPU's initialisation only, and
the flag restored afterwards (the bits are checked on the GPU: experiments/benchmarks/
init_compile.py)."""

import types

import jax
import pytest

from hybrid_jax.nn.init_random import fast_random_compile

FLAG = "jax_threefry_gpu_kernel_lowering"


def test_on_the_cpu_nothing_changes():
    with fast_random_compile() as used:
        assert not used and getattr(jax.config, FLAG) is False
    assert getattr(jax.config, FLAG) is False


def test_on_one_gpu_the_kernel_is_used_and_the_flag_restored(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for mesh in (None, types.SimpleNamespace(size=1)):
        with fast_random_compile(mesh) as used:
            assert used and getattr(jax.config, FLAG) is True
        assert getattr(jax.config, FLAG) is False
    with pytest.raises(RuntimeError, match="boom"), fast_random_compile():
        raise RuntimeError("boom")
    assert getattr(jax.config, FLAG) is False


def test_a_mesh_of_several_devices_keeps_the_partitionable_lowering(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with fast_random_compile(types.SimpleNamespace(size=8)) as used:
        assert not used and getattr(jax.config, FLAG) is False
