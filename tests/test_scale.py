"""`hybrid-jax scale` end to end on fake CPU devices (tiny): a row per strategy and device
count with positive throughput, efficiency 1 at one device, FLOPs from `hybrid_jax.flops`, a
JSON and a Markdown table and a plot; presets in place of the experiment's model and the time
limit."""

import json

import pytest

from experiments import registry
from experiments.cli import main
from experiments.scale import experiments_to_run
from hybrid_jax import presets
from hybrid_jax.flops import step_flops


def test_scale_writes_table_and_plot(tmp_path, capsys):
    assert main(["scale", "mqar-hybrid-tiny", "--devices", "1,2", "--strategy", "seq",
                 "--steps", "1", "--weak", "--out", str(tmp_path),
                 "--set", "train.batch_size=2", "--set", "data.seq_len=32"]) == 0
    record = json.loads((tmp_path / "scale.json").read_text())
    rows = {(r["strategy"], r["devices"]): r for r in record["rows"]}
    assert sorted(rows) == [("seq", 1), ("seq", 2)]
    assert {r["model"] for r in record["rows"]} == {"mqar-hybrid-tiny"}  # its name, not a word
    assert record["mode"] == "weak"
    assert rows[("seq", 2)]["seq_len"] == 64 and rows[("seq", 2)]["batch"] == 2
    model = registry.get("mqar-hybrid-tiny").model
    for (_, devices), row in rows.items():
        assert row["tokens_per_s"] > 0 and row["forward_tokens_per_s"] > 0
        assert row["peak_mb_per_device"] > 0 and row["forward_peak_mb_per_device"] > 0
        flops = step_flops(model, row["seq_len"])  # the one FLOP count, per device and second
        tokens = row["batch"] * row["seq_len"]
        assert row["tflops_per_device"] == pytest.approx(
            flops.training_per_token() * tokens / (row["train_ms"] / 1e3) / devices / 1e12)
        assert row["forward_tflops_per_device"] == pytest.approx(
            flops.training_per_token() / 3 * tokens / (row["forward_ms"] / 1e3) / devices / 1e12)
        if devices == 1:
            assert row["efficiency"] == pytest.approx(1.0)
    assert (tmp_path / "scale.png").stat().st_size > 0
    assert (tmp_path / "scale.md").read_text().startswith("| model | strategy | devices |")
    assert "tokens_per_s" in capsys.readouterr().out


def test_presets_in_place_of_the_model_and_the_time_limit(tmp_path, capsys):
    (label, experiment), = experiments_to_run("mqar-hybrid-tiny", ["gdn-tiny"],
                                              ["model.remat=full"])
    assert label == "gdn-tiny"
    assert experiment.model == presets.get("gdn-tiny").replace(remat="full")
    assert experiment.data == registry.get("mqar-hybrid-tiny").data
    assert main(["scale", "mqar-hybrid-tiny", "--devices", "1", "--model",
                 "transformer-tiny,gdn-tiny", "--time-limit", "0", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "scale.json").read_text())
    assert record["rows"] == []
    assert record["skipped"] == ["transformer-tiny data x1", "gdn-tiny data x1"]
    assert "skipped gdn-tiny data x1: over the --time-limit of 0 s" in capsys.readouterr().out
    assert main(["scale", "mqar-hybrid-tiny", "--model", "no-such-model"]) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--devices", "1,3"], "data x3: train.batch_size=4 does not split over the mesh's batch "
                           "axes (data 3 x fsdp 1 = 3 shards)"),
    (["--devices", "3", "--strategy", "seq"], "seq x3: data.seq_len=32 does not split over 3 "
                                              "seq devices"),
])
def test_settings_the_mesh_cannot_split_are_refused_before_any_is_timed(tmp_path, capsys, argv,
                                                                         message):
    assert main(["scale", "mqar-hybrid-tiny", *argv, "--out", str(tmp_path / "out"),
                 "--set", "train.batch_size=4", "--set", "data.seq_len=32"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # no row of the 1-device setting either


def test_scale_names_bad_arguments(capsys):
    assert main(["scale", "mqar-hybrid-tiny", "--strategy", "pipeline"]) == 2
    assert "--strategy: ['pipeline'] not in" in capsys.readouterr().err
