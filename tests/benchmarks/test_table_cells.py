"""The kernel tables' shared cells (`timing.measure_into`, `floor_columns`, `error_text`): a
row is measured, skipped past the budget, or carries its error; floors and multiples."""

from __future__ import annotations

import time

from experiments.benchmarks.timing import error_text, floor_columns, measure_into


def test_a_row_is_measured_skipped_or_carries_its_error():
    row = {}
    measure_into(row, time.perf_counter() + 60, lambda a, b: {"fwd_ms": a + b}, 1.0, 2.0)
    assert row == {"fwd_ms": 3.0}
    row = {}
    measure_into(row, time.perf_counter() - 1, lambda: {"fwd_ms": 1.0})
    assert row == {"error": "skipped: time budget spent"}

    def fails():
        raise ValueError("shared memory 250 KB\nmore detail")

    row = {}
    measure_into(row, time.perf_counter() + 60, fails)
    assert row == {"error": "ValueError: shared memory 250 KB"}
    assert error_text(RuntimeError()) == "RuntimeError: "


def test_floors_and_their_multiples():
    row = {"fwd_ms": 0.3}
    floor_columns(row, {"fwd": 0.1, "fwd_bwd": 0.4})
    assert row == {"fwd_ms": 0.3, "fwd_floor_ms": 0.1, "fwd_x_floor": 0.3 / 0.1,
                   "fwd_bwd_floor_ms": 0.4}
