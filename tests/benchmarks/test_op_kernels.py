"""The per-kernel profile script runs end to end (CPU: the trace holds no GPU kernels, so the
rows are empty, but every op and pass must compile, run and be written without an error), at a
shape given with heads and dims (V != K)."""

from __future__ import annotations

import json
import sys

from experiments.benchmarks import op_kernels


def test_op_kernels_writes_every_pass_without_errors(tmp_path, monkeypatch):
    out = tmp_path / "op_kernels.json"
    monkeypatch.setattr(sys, "argv", ["op_kernels", "--ops", "ssd,native_hybrid_attention",
                                      "--shape", "1x64x2x16x32", "--impl", "xla", "--window", "16",
                                      "--out", str(out)])
    op_kernels.main()
    record = json.loads(out.read_text())
    assert record["shape"] == "1x64x2x16x32" and record["impl"] == "xla" and record["window"] == 16
    assert not [row for row in record["rows"] if "error" in row]
