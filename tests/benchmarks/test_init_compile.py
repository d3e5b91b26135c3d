"""`experiments/benchmarks/init_compile.py`: the two Threefry lowerings' parameters compared
(on the CPU both are XLA's lowering, so the check must find them equal; its timing part, a
child process per model, ran on the H200: BENCHMARKS.md)."""

from experiments.benchmarks import init_compile


def test_check_compares_every_parameter():
    row = init_compile.check_row("transformer-tiny")
    assert row == {"part": "check", "model": "transformer-tiny", "arrays": 20, "identical": True}
