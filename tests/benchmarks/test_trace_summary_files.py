"""`trace_summary`: a directory's newest trace is the one read, and `trace_calls` divides by
the calls it traced (the per-call times of op_kernels and pha_efficiency)."""

from __future__ import annotations

import os

import jax.numpy as jnp

from experiments.benchmarks import trace_summary


def test_the_newest_trace_of_a_directory(tmp_path):
    old, new = (tmp_path / name / "perfetto_trace.json.gz" for name in ("b_old", "a_new"))
    for path, mtime in ((old, 1_000_000), (new, 2_000_000)):
        path.parent.mkdir()
        path.write_bytes(b"")
        os.utime(path, (mtime, mtime))
    assert trace_summary.trace_file(tmp_path) == new


def test_trace_calls_summarizes_per_call(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(trace_summary, "summarize", lambda *a, **kw: seen.append((a, kw)))
    calls = []
    trace_summary.trace_calls(lambda x: calls.append(1) or x + 1, (jnp.ones(2),), runs=3,
                              directory=tmp_path)
    [((folder, steps), kw)] = seen
    assert len(calls) == 3 and steps == 3 and not kw
    assert str(folder).startswith(str(tmp_path))
