"""context_parallel_combine: one device has nothing to combine; it said so by crashing on an
empty table after parsing (IndexError on rows[0])."""

import sys

import pytest

from experiments.benchmarks import context_parallel_combine


def test_one_device_is_refused_naming_the_flag(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["context_parallel_combine", "--devices", "1",
                                      "--out", str(tmp_path / "out.json")])
    with pytest.raises(SystemExit) as exit_info:
        context_parallel_combine.main()
    assert exit_info.value.code == 2
    assert "--devices must be at least 2, got 1" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
