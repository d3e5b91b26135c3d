"""`hybrid-jax scale` end to end on fake CPU devices (tiny): a row per strategy and device
count with positive throughput, efficiency 1 at one device, FLOPs from `hybrid_jax.flops`, a
JSON and a Markdown table and a plot; presets in place of the experiment's model and the time
limit."""

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from experiments import registry, scale
from experiments.cli import main
from experiments.scale import (
    STRATEGIES,
    _peak_mb,
    add_efficiency,
    experiments_to_run,
    scaled_experiment,
)
from hybrid_jax import presets
from hybrid_jax.flops import step_flops


def test_scale_writes_table_and_plot(tmp_path, capsys, monkeypatch):
    import hybrid_jax.flops

    peak = 1e12  # a known peak (CPU has none): MFU by 6N and by the model count
    monkeypatch.setattr(hybrid_jax.flops, "device_peak_flops", lambda: peak)
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
        assert row["tokens_per_s"] == pytest.approx(tokens / (row["train_ms"] / 1e3))
        assert row["forward_tokens_per_s"] == pytest.approx(tokens / (row["forward_ms"] / 1e3))
        assert row["mfu"] == pytest.approx(
            flops.six_n * tokens / (row["train_ms"] / 1e3) / devices / peak)
        assert row["mfu_model"] == pytest.approx(row["tflops_per_device"] * 1e12 / peak)
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
    (["--devices", "3", "--strategy", "seq"], "seq x3: data.seq_len=32 does not split over the "
                                              "mesh's 3 'seq' devices"),
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
    assert main(["scale", "mqar-hybrid-tiny", "--devices", " , "]) == 2
    assert "--devices: expected a comma-separated list, got ' , '" in capsys.readouterr().err
    assert main(["scale", "mqar-hybrid-tiny", "--devices", "1,16"]) == 2
    assert "--devices 16 but only 8 devices are available" in capsys.readouterr().err
    # A repeat measured one setting twice: two rows of one label (refused before any timing).
    for flag, value, repeated in [("--devices", "1,2,1", "['1']"),
                                  ("--strategy", "data,seq,data", "['data']"),
                                  ("--model", "gdn-tiny,gdn-tiny", "['gdn-tiny']")]:
        assert main(["scale", "mqar-hybrid-tiny", flag, value]) == 2
        assert (f"{flag}: {repeated} given more than once in {value}"
                in capsys.readouterr().err)


def test_cpu_devices_are_requested_only_before_jax_loads(monkeypatch):
    """The flag is appended to XLA_FLAGS (kept) once, and not at all after jax is imported (too
    late to take effect) or when the flag is there already."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=x")
    monkeypatch.setattr(scale, "sys", types.SimpleNamespace(modules={}))  # jax not loaded
    scale.request_cpu_devices(4)
    scale.request_cpu_devices(8)
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=x --xla_force_host_platform_device_count=4"
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setattr(scale, "sys", types.SimpleNamespace(modules={"jax": None}))
    scale.request_cpu_devices(4)
    assert os.environ["XLA_FLAGS"] == ""


def test_importing_scale_leaves_jax_unloaded_so_the_device_request_works():
    """`experiments.scale` imported hybrid_jax (and so jax) at the top, so `hybrid-jax scale
    --devices 1,2` on a CPU asked for fake devices too late: '--devices 2 but only 1 devices
    are available'."""
    code = "import sys; from experiments import scale; print('jax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip() == "False"


def test_weak_scaling_multiplies_the_split_work():
    """Weak: the batch grows with data / fsdp / tensor devices, the sequence with seq ones;
    strong keeps both. The mesh puts every device on the strategy's axis."""
    experiment = registry.get("mqar-hybrid-tiny")
    batch, length = experiment.train.batch_size, experiment.data.seq_len
    for strategy in STRATEGIES:
        weak = scaled_experiment(experiment, strategy, 4, weak=True)
        strong = scaled_experiment(experiment, strategy, 4, weak=False)
        assert (weak.train.batch_size, weak.data.seq_len) == (
            (batch, 4 * length) if strategy == "seq" else (4 * batch, length))
        assert (strong.train.batch_size, strong.data.seq_len) == (batch, length)
        for scaled in (weak, strong):
            sizes = dataclasses.asdict(scaled.train.mesh)
            assert {a: sizes[a] for a in STRATEGIES} == {a: 4 if a == strategy else 1
                                                         for a in STRATEGIES}


def test_efficiency_is_per_model_and_strategy():
    rows = [dict(model=m, strategy=s, devices=n, tflops_per_device=t)
            for m, s, n, t in [("a", "data", 1, 2.0), ("a", "data", 4, 1.0), ("b", "data", 2, 8.0),
                               ("b", "data", 4, 6.0), ("a", "seq", 2, 3.0), ("a", "seq", 8, 1.5)]]
    add_efficiency(rows)
    assert [r["efficiency"] for r in rows] == [1.0, 0.5, 1.0, 0.75, 1.0, 0.5]


def test_peak_memory_counts_donated_buffers_once():
    analysis = types.SimpleNamespace(argument_size_in_bytes=3 * 2**20,
                                     output_size_in_bytes=2 * 2**20,
                                     temp_size_in_bytes=2**19, alias_size_in_bytes=2**20)
    assert _peak_mb(types.SimpleNamespace(memory_analysis=lambda: analysis)) == 4.5
    assert _peak_mb(types.SimpleNamespace(memory_analysis=lambda: None)) is None


def test_the_json_holds_every_row_measured_before_a_failure(tmp_path, monkeypatch):
    """`scale.json` is rewritten after every row: a crash in the second setting keeps the
    first."""
    def measure(experiment, strategy, devices, **kwargs):
        if devices == 2:
            raise RuntimeError("out of memory")
        return dict(model=kwargs["model"], strategy=strategy, devices=devices,
                    tflops_per_device=1.0)

    monkeypatch.setattr(scale, "measure", measure)
    with pytest.raises(RuntimeError, match="out of memory"):
        scale.run("mqar-hybrid-tiny", [1, 2], ["data"], weak=False, steps=1, out=tmp_path)
    rows = json.loads((tmp_path / "scale.json").read_text())["rows"]
    assert [(r["model"], r["devices"], r["efficiency"]) for r in rows] == [
        ("mqar-hybrid-tiny", 1, 1.0)]


def test_a_write_cut_short_keeps_the_previous_json(tmp_path, monkeypatch):
    """scale.json was rewritten in place: a write cut short (disk full, a kill) left a torn
    file, the rows measured before it lost."""
    monkeypatch.setattr(scale, "measure", lambda experiment, strategy, devices, **kwargs: dict(
        model=kwargs["model"], strategy=strategy, devices=devices, tflops_per_device=1.0))
    write_text = Path.write_text

    def cut_short(path, text, *args, **kwargs):
        if '"devices": 2' in text:
            write_text(path, text[:len(text) // 2])
            raise OSError("No space left on device")
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(OSError, match="No space left"):
        scale.run("mqar-hybrid-tiny", [1, 2], ["data"], weak=False, steps=1, out=tmp_path)
    rows = json.loads((tmp_path / "scale.json").read_text())["rows"]
    assert [r["devices"] for r in rows] == [1]
    assert not list(tmp_path.glob("scale.json*.tmp"))


def test_fewest_devices_are_measured_first(tmp_path, monkeypatch):
    """The efficiency's base (the fewest devices) comes before any setting the time limit may
    skip, whatever the order of --devices."""
    measured = []

    def measure(experiment, strategy, devices, **kwargs):
        measured.append(devices)
        return dict(model=kwargs["model"], strategy=strategy, devices=devices,
                    tflops_per_device=1.0)

    monkeypatch.setattr(scale, "measure", measure)
    monkeypatch.setattr(scale, "plot", lambda rows, path, title: path)
    scale.run("mqar-hybrid-tiny", [4, 1, 2], ["data"], weak=False, steps=1, out=tmp_path,
              overrides=["train.batch_size=4"])
    assert measured == [1, 2, 4]


def test_the_axis_rules_setting_reaches_every_setting(monkeypatch):
    """`--set train.mesh.axis_rules=...` (and its overrides) lay out the timed steps and decide
    the batch axes of the check: the strategy's mesh kept only its sizes, and the steps ran
    under the default rules."""
    from hybrid_jax import sharding
    from hybrid_jax.train import trainer

    class Initialised(Exception):
        pass

    def init_train_state(experiment, mesh):
        raise Initialised(sharding.current_rules()["embed"], experiment.train.mesh.axis_rules)

    monkeypatch.setattr(trainer, "init_train_state", init_train_state)
    (_, experiment), = experiments_to_run("mqar-hybrid-tiny", [], [
        "train.mesh.axis_rules=replicated", "train.batch_size=4",
        'train.mesh.axis_rule_overrides=["batch=data"]'])
    scale.check_setting(experiment, "fsdp", 8, weak=False)  # the batch is not split over fsdp
    with pytest.raises(Initialised) as raised:
        scale.measure(experiment, "fsdp", 2, weak=False, steps=1, model="m")
    assert raised.value.args == (None, "replicated")
