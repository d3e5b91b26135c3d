"""`experiments/benchmarks/init_compile.py`: the two Threefry lowerings' parameters compared
(on the CPU both are XLA's lowering, so the check must find them equal; its timing part, a
child process per model, ran on the H200: BENCHMARKS.md)."""

from experiments.benchmarks import init_compile


def test_check_compares_every_parameter():
    row = init_compile.check_row("transformer-tiny")
    assert row == {"part": "check", "model": "transformer-tiny", "arrays": 20, "identical": True}


def test_a_fused_child_killed_without_a_word_is_a_row(monkeypatch):
    """A child killed by a signal (the host's out-of-memory killer) exits with an empty stderr:
    the row says how it exited (the last line of nothing was an IndexError that ended the run
    before its JSON)."""
    import subprocess

    def run(command, **kw):
        raise subprocess.CalledProcessError(-9, command, output="", stderr="")

    monkeypatch.setattr(init_compile, "_compiled_init", lambda name, kernel: (None, 1.5))
    monkeypatch.setattr(init_compile.subprocess, "run", run)
    row = init_compile.time_row("gdn-tiny", 5.0)
    assert row == {"part": "time", "model": "gdn-tiny", "kernel_compile_s": 1.5,
                   "error": "fused child exit -9"}
