"""`hybrid-jax scale` end to end on fake CPU devices (tiny): a row per strategy and device
count with positive throughput, efficiency 1 at one device, XLA-counted FLOPs, a JSON table
and a plot."""

import json

import pytest

from experiments.cli import main


def test_scale_writes_table_and_plot(tmp_path, capsys):
    assert main(["scale", "mqar-hybrid-tiny", "--devices", "1,2", "--strategy", "seq",
                 "--steps", "1", "--weak", "--out", str(tmp_path),
                 "--set", "train.batch_size=2", "--set", "data.seq_len=32"]) == 0
    record = json.loads((tmp_path / "scale.json").read_text())
    rows = {(r["strategy"], r["devices"]): r for r in record["rows"]}
    assert sorted(rows) == [("seq", 1), ("seq", 2)]
    assert record["mode"] == "weak"
    assert rows[("seq", 2)]["seq_len"] == 64 and rows[("seq", 2)]["batch"] == 2
    for (_, devices), row in rows.items():
        assert row["tokens_per_s"] > 0 and row["tflops_per_device"] > 0
        assert row["peak_mb_per_device"] > 0
        if devices == 1:
            assert row["efficiency"] == pytest.approx(1.0)
    assert (tmp_path / "scale.png").stat().st_size > 0
    assert "tokens_per_s" in capsys.readouterr().out


def test_scale_names_bad_arguments(capsys):
    assert main(["scale", "mqar-hybrid-tiny", "--strategy", "pipeline"]) == 2
    assert "--strategy: ['pipeline'] not in" in capsys.readouterr().err
