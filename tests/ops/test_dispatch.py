"""The rung chooser: named rungs run or refuse loudly; auto skips rungs by platform and says why
(except for a rung of another platform altogether)."""

from __future__ import annotations

import logging

import numpy as np
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


def test_a_rung_of_another_platform_is_no_candidate(monkeypatch):
    """`platforms`: elsewhere auto passes over the rung without a reason (nothing to log); a
    named call still asks its `unsupported`."""
    tpu_kernel = Rung("splash", lambda x: "tpu kernel", platforms=("tpu",),
                      unsupported=lambda x: None if dispatch.backend() == "tpu"
                      else "needs a TPU backend")
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    assert dispatch.choose("op", (tpu_kernel, XLA), None, 1) == (XLA, [])
    with pytest.raises(ValueError, match="'splash' cannot run this call: needs a TPU backend"):
        dispatch.choose("op", (tpu_kernel, XLA), "splash", 1)
    monkeypatch.setattr(dispatch, "backend", lambda: "tpu")
    assert dispatch.choose("op", (tpu_kernel, XLA), None, 1)[0] is tpu_kernel


def test_a_kernel_not_yet_run_anywhere_is_never_automatic(monkeypatch):
    """`auto_platforms=()`: a kernel tested only in interpret mode; auto passes over it on every
    platform and says why, a named call runs it."""
    untried = Rung("pallas", lambda x: "kernel", auto_platforms=())
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    rung, reasons = dispatch.choose("op", (untried, XLA), None, 1)
    assert rung is XLA and reasons == [
        "pallas: not chosen automatically on gpu (on no platform yet: not yet run on one; "
        "implementation='pallas' runs it)"]
    assert dispatch.choose("op", (untried, XLA), "pallas", 1) == (untried, [])


def test_a_special_case_rung_is_no_candidate_where_its_case_does_not_arise(monkeypatch):
    """`applies`: where False auto passes over the rung without a reason; where True its
    `unsupported` may still refuse, with the reason; a named call asks only `unsupported`."""
    special = Rung("attention", lambda x: "special", applies=lambda x: x > 0,
                   unsupported=lambda x: None if x != 2 else "two is refused")
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    assert dispatch.choose("op", (special, XLA), None, 0) == (XLA, [])
    assert dispatch.choose("op", (special, XLA), None, 1) == (special, [])
    assert dispatch.choose("op", (special, XLA), None, 2) == (XLA, ["attention: two is refused"])
    assert dispatch.choose("op", (special, XLA), "attention", 0) == (special, [])


def test_a_fallback_logs_once_by_level_and_never_on_a_cpu(monkeypatch, caplog):
    """On an accelerator a fallback to the XLA rung is a warning and to another fast rung
    information, once per op, rung and shapes; on a CPU, where the XLA rung is the natural
    one, nothing is logged."""
    refusing = Rung("pallas", lambda x: "kernel", unsupported=lambda x: "head dim 96")
    middle = Rung("attention", lambda x: "attention")
    x = np.zeros((2, 3), np.float32)
    dispatch._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger=dispatch.logger.name):
        monkeypatch.setattr(dispatch, "backend", lambda: "cpu")
        assert dispatch.dispatch("op", (refusing, XLA), None, x) == "xla"
        assert not caplog.records
        monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
        for _ in range(2):
            assert dispatch.dispatch("op", (refusing, XLA), None, x) == "xla"
            assert dispatch.dispatch("op", (refusing, middle, XLA), None, x) == "attention"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "op: ran the xla rung for 0[2, 3] float32; faster rungs could not: "
                          "pallas: head dim 96"),
        (logging.INFO, "op: ran the attention rung for 0[2, 3] float32; faster rungs could "
                       "not: pallas: head dim 96")]
    dispatch._LOGGED.clear()


def test_passing_over_another_xla_form_is_information_not_a_warning(monkeypatch, caplog):
    """DSS on packed text: its convolution ("fft", an XLA form) cannot restart at documents and
    the chunked XLA rung, made for them, runs: said, but no warning on every PHA run. A kernel
    refused before it still makes the fallback a warning."""
    fft = Rung("fft", lambda x: "fft", unsupported=lambda x: "documents")
    kernel = Rung("pallas", lambda x: "kernel", unsupported=lambda x: "head dim 96")
    x = np.zeros((2,), np.float32)
    dispatch._LOGGED.clear()
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    with caplog.at_level(logging.INFO, logger=dispatch.logger.name):
        assert dispatch.dispatch("dss", (fft, XLA), None, x) == "xla"
        assert dispatch.dispatch("op", (kernel, fft, XLA), None, x) == "xla"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "dss: ran the xla rung for 0[2] float32; faster rungs could not: "
                       "fft: documents"),
        (logging.WARNING, "op: ran the xla rung for 0[2] float32; faster rungs could not: "
                          "pallas: head dim 96; fft: documents")]
    dispatch._LOGGED.clear()
