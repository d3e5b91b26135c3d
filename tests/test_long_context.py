"""The long-context probe's search (experiments/benchmarks/long_context.py) with a fake prober:
the climb over the lengths, doubling, the bisection after the first out-of-memory, the probe
limit and the budget, and the summary table."""

import argparse
import json
import time

from experiments.benchmarks import long_context


class FakeProber:
    """Out of memory above `fits`; a step takes T / 1e4 s."""

    def __init__(self, fits: int):
        self.name, self.fits, self.last, self.probed = "fake", fits, None, []

    def predicted_step_s(self, length):
        return None if self.last is None else length / 1e4

    def probe(self, length, probe_limit):
        self.probed.append(length)
        row = {"model": self.name, "T": length, "compile_s": 0.0}
        if length > self.fits:
            row["oom"] = "RESOURCE_EXHAUSTED"
        elif length / 1e4 > probe_limit:
            row["not_run"] = "fits; predicted step too long"
        else:
            row.update(step_s=length / 1e4, tokens_per_s=1e4)
            self.last = row
        return row


def _run(fits, capsys, probe_limit=1e9, budget=1e9):
    args = argparse.Namespace(lengths="8192,32768,131072", max_length=1 << 20,
                              probe_limit=probe_limit)
    prober = FakeProber(fits)
    long_context.probe_lengths(prober, args, time.time() + budget)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return prober.probed, rows, long_context.summarise("fake", rows)


def test_climb_then_bisect_to_the_largest_power_of_two(capsys):
    probed, _, summary = _run(65536, capsys)
    # 8k, 32k fit, 128k fails; 64k (between 32k and 128k) fits: the largest is 64k.
    assert probed == [8192, 32768, 131072, 65536]
    assert summary["largest_T_trained"] == 65536 and summary["first_T_failed"] == 131072
    assert summary["limited_by"] == "out of memory"


def test_doubling_past_the_lengths_and_the_first_failure(capsys):
    probed, _, summary = _run(300_000, capsys)
    assert probed == [8192, 32768, 131072, 262144, 524288]
    assert summary["largest_T_trained"] == 262144 and summary["first_T_failed"] == 524288
    probed, _, summary = _run(2048, capsys)  # the first length already fails: halve
    assert probed == [8192, 4096, 2048] and summary["largest_T_trained"] == 2048
    probed, _, summary = _run(512, capsys)
    assert probed == [8192, 4096, 2048, 1024] and summary["largest_T_trained"] is None


def test_probe_limit_and_budget_are_reported(capsys):
    _, rows, summary = _run(1 << 20, capsys, probe_limit=20)
    assert summary["largest_T_trained"] == 131072  # 262144 / 1e4 s > 20 s: compiled only
    assert summary["largest_T_compiled_fits"] == 1 << 20
    assert any("predicted step too long" in line for line in summary["not_probed"])
    _, rows, summary = _run(1 << 20, capsys, budget=0)
    assert summary["largest_T_trained"] is None
    assert [r["T"] for r in rows if "skipped" in r] == [8192, 32768, 131072, 262144, 524288,
                                                        1 << 20]


def test_a_childs_library_records_reach_the_drivers_stderr(capsys, monkeypatch):
    """A child's stderr is captured (printed whole only when it fails): its hybrid_jax records
    (which rung ran and why) are passed on, each under the model's name, and its rows read."""
    row = {"model": "fake", "T": 8192, "step_s": 1.0}

    class Child:
        returncode = 0

        def __init__(self, command, **kwargs):
            assert command[command.index("--child") + 1] == "fake"

        def communicate(self, timeout=None):
            return (json.dumps(row) + "\n", "W1207 noise\nhybrid_jax.dispatch INFO: attention "
                    "ran the pallas rung\n")

    monkeypatch.setattr(long_context.subprocess, "Popen", Child)
    args = argparse.Namespace(lengths="8192", max_length=8192, probe_limit=10)
    assert long_context.run_child("fake", args, share=60) == [row]
    assert capsys.readouterr().err == ("fake: hybrid_jax.dispatch INFO: attention ran the "
                                       "pallas rung\n")
