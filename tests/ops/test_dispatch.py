"""The rung chooser: named rungs run or refuse loudly; auto skips rungs by platform and says why."""

from __future__ import annotations

import pytest

from hybrid_jax.ops import dispatch
from hybrid_jax.ops.dispatch import Rung

KERNEL = Rung("pallas", lambda x: "kernel", auto_platforms=("gpu",))
XLA = Rung("xla", lambda x: "xla")


@pytest.mark.parametrize("platform, chosen", [("gpu", "pallas"), ("tpu", "xla"),
                                              ("cpu", "xla")])
def test_auto_takes_a_rung_only_on_its_platforms(monkeypatch, platform, chosen):
    monkeypatch.setattr(dispatch, "backend", lambda: platform)
    rung, reasons = dispatch.choose("op", (KERNEL, XLA), None, 1)
    assert rung.name == chosen
    assert reasons == ([] if chosen == "pallas" else [
        f"pallas: not chosen automatically on {platform} (only on gpu; "
        "implementation='pallas' runs it)"])


def test_a_named_rung_runs_off_its_auto_platforms(monkeypatch):
    monkeypatch.setattr(dispatch, "backend", lambda: "tpu")
    rung, reasons = dispatch.choose("op", (KERNEL, XLA), "pallas", 1)
    assert rung.name == "pallas" and reasons == []
    with pytest.raises(ValueError, match="implementation='triton' is not available"):
        dispatch.choose("op", (KERNEL, XLA), "triton", 1)
