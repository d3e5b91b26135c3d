"""The fla peer's warm-up workers: each keeps its slice of a kernel's autotuning configs."""

import sys
import types

import pytest

from experiments.benchmarks.peers.autotune_warm import restrict_autotuning


@pytest.fixture
def fake_triton(monkeypatch):
    """A `triton.runtime.autotuner.Autotuner` whose pruning returns the configs it holds."""

    class Autotuner:
        def __init__(self, configs):
            self.configs = configs

        def prune_configs(self, kwargs):
            return list(self.configs)

    autotuner = types.ModuleType("triton.runtime.autotuner")
    autotuner.Autotuner = Autotuner
    runtime = types.ModuleType("triton.runtime")
    runtime.autotuner = autotuner
    triton = types.ModuleType("triton")
    triton.runtime = runtime
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.runtime", runtime)
    monkeypatch.setitem(sys.modules, "triton.runtime.autotuner", autotuner)
    return Autotuner


def test_workers_cover_every_config_once(fake_triton):
    configs = [f"c{i}" for i in range(7)]
    seen = []
    original = fake_triton.prune_configs
    for worker in range(3):
        restrict_autotuning(f"{worker}/3")
        seen.append(fake_triton(configs).prune_configs({}))
        fake_triton.prune_configs = original
    assert seen == [["c0", "c3", "c6"], ["c1", "c4"], ["c2", "c5"]]


def test_fewer_configs_than_workers_keeps_one(fake_triton):
    restrict_autotuning("5/8")
    assert fake_triton(["a", "b"]).prune_configs({}) == ["b"]


def test_bad_slice_is_refused(fake_triton):
    with pytest.raises(ValueError, match="0 <= i < n"):
        restrict_autotuning("3/3")
