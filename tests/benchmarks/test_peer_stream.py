"""The peer runner keeps the rows a peer printed before it was stopped at its time limit."""

from __future__ import annotations

import sys

from experiments.benchmarks.linear_ops import fla_rows
from experiments.benchmarks.peers import stream

PEER = """
import json, sys, time
print(json.dumps({"fla_version": "x"}), flush=True)
print("not json", flush=True)
print(json.dumps({"op": "ssd", "B": 4, "T": 8192, "fwd_ms": 1.0, "partial": True}), flush=True)
print(json.dumps({"op": "ssd", "B": 4, "T": 8192, "fwd_ms": 1.0, "fwd_bwd_ms": 3.0}), flush=True)
print(json.dumps({"op": "gsa", "B": 4, "T": 8192, "fwd_ms": 2.0, "partial": True}), flush=True)
if sys.argv[1] == "hang":
    time.sleep(60)
sys.exit(int(sys.argv[1] == "fail"))
"""


def test_rows_before_a_timeout_are_kept_and_the_peer_is_killed():
    rows, failure = stream.run_json_lines([sys.executable, "-c", PEER, "hang"], timeout=3)
    assert failure == "timed out after 3 s"
    assert [r.get("op") for r in rows] == [None, "ssd", "ssd", "gsa"]


def test_a_failing_peer_says_so_with_its_rows():
    rows, failure = stream.run_json_lines([sys.executable, "-c", PEER, "fail"], timeout=30)
    assert failure.startswith("exit 1") and len(rows) == 4
    rows, failure = stream.run_json_lines([sys.executable, "-c", PEER, "ok"], timeout=30)
    assert failure == "" and len(rows) == 4


def test_fla_rows_keeps_the_last_row_per_op_and_shape(monkeypatch):
    def fake(command, timeout, echo, env=None):
        return stream.run_json_lines([sys.executable, "-c", PEER, "hang"], 3, echo=echo)

    monkeypatch.setattr("experiments.benchmarks.linear_ops.run_json_lines", fake)
    rows = fla_rows("4x8192", "ssd,gsa", timeout=3)
    assert rows == [{"op": "ssd", "B": 4, "T": 8192, "fwd_ms": 1.0, "fwd_bwd_ms": 3.0},
                    {"op": "gsa", "B": 4, "T": 8192, "fwd_ms": 2.0,
                     "error": "fwd+bwd not reached: timed out after 3 s"}]


def test_fla_rows_gives_the_peer_a_triton_cache(monkeypatch, tmp_path):
    seen = {}

    def fake(command, timeout, echo, env=None):
        seen.update(env or {})
        return [], ""

    monkeypatch.setattr("experiments.benchmarks.linear_ops.run_json_lines", fake)
    fla_rows("4x8192", "ssd", timeout=3, cache=str(tmp_path / "triton"))
    assert seen == {"TRITON_CACHE_DIR": str(tmp_path / "triton"),
                    "TRITON_CACHE_AUTOTUNING": "1"}


def test_run_json_lines_sets_the_peer_environment():
    peer = "import json, os; print(json.dumps({'v': os.environ['HYBRID_JAX_PEER_TEST']}))"
    rows, failure = stream.run_json_lines([sys.executable, "-c", peer], timeout=30,
                                          env={"HYBRID_JAX_PEER_TEST": "x"})
    assert failure == "" and rows == [{"v": "x"}]


def test_fla_rows_over_several_runs_keep_each_rows_fastest_times(monkeypatch):
    times = iter([(1.0, 3.0), (0.8, 3.5), (0.9, None)])

    def fake(command, timeout, echo, env=None):
        fwd, fwd_bwd = next(times)
        row = {"op": "ssd", "B": 4, "T": 8192, "fwd_ms": fwd}
        return [row if fwd_bwd is None else {**row, "fwd_bwd_ms": fwd_bwd}], ""

    monkeypatch.setattr("experiments.benchmarks.linear_ops.run_json_lines", fake)
    rows = fla_rows("4x8192", "ssd", timeout=30, runs=3)
    assert rows == [{"op": "ssd", "B": 4, "T": 8192, "fwd_ms": 0.8, "fwd_bwd_ms": 3.0,
                     "fwd_ms_runs": [1.0, 0.8, 0.9], "fwd_bwd_ms_runs": [3.0, 3.5]}]
