"""The Oryx experiment scripts: mode schedules and segments (default), and end to end on a
2-step tiny run (slow): oryx_modes, oryx_switch and the speculative-decoding benchmark."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import oryx_modes, oryx_switch, registry
from experiments.benchmarks import oryx_speculative
from experiments.cli import main as cli_main
from experiments.configs.oryx import BASELINES
from experiments.oryx_modes import SINGLE_MIXER, is_oryx
from experiments.oryx_modes import main as modes_main
from experiments.oryx_switch import main as switch_main
from experiments.oryx_switch import segments, switch_modes
from hybrid_jax.config import layer
from hybrid_jax.nn.oryx import ATTENTION, LINEAR, MODE
from tests.test_cli import TINY_RUN


def test_switch_modes_and_segments():
    modes = switch_modes(10, [3, 7])
    assert modes.tolist() == [ATTENTION] * 3 + [LINEAR] * 4 + [ATTENTION] * 3
    curves = {"a": np.arange(20.0), "b": np.zeros(20)}
    rows = segments(curves, [12])  # SETTLE = 8: [0, 8) [8, 12) [12, 20)
    assert [r["positions"] for r in rows] == [[0, 8], [8, 12], [12, 20]]
    assert [r["a"] for r in rows] == [3.5, 9.5, 15.5] and all(r["b"] == 0 for r in rows)
    # A baseline of shorter rows was averaged over the positions it had.
    with pytest.raises(ValueError, match=r"one row length, got \{'a': 20, 'b': 20, 'c': 16\}"):
        segments({**curves, "c": np.zeros(16)}, [12])


@pytest.mark.parametrize("flag, value", [("--k", "0,2"), ("--k", "2,2"), ("--batch", "1,x"),
                                         ("--presets-batch", "-1")])
def test_speculative_refuses_bad_counts_before_training(tmp_path, flag, value):
    """A k of 0 timed attention decoding a second time (a row named "attention" among the
    speculative ones); checked before --train spends its steps."""
    with pytest.raises(ValueError, match=f"{flag}: expected .*integers >= 1.*got '{value}'"):
        oryx_speculative.main(["--train", "no-such-experiment", "--out-dir", str(tmp_path),
                               flag, value])


def test_speculative_budget_of_zero_times_nothing(tmp_path, monkeypatch, capsys):
    """`--budget-s 0` was taken for no budget (`budget_s or inf`): every configuration ran."""
    monkeypatch.setattr(oryx_speculative, "preset_model",  # no model: nothing may be timed
                        lambda name, dtype: (name, None, lambda batch, length: None))
    out = tmp_path / "speculative.json"
    assert oryx_speculative.main(["--presets", "oryx-mamba2-tiny", "--k", "2", "--batch", "1",
                                  "--budget-s", "0", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["k"], r.get("skipped")) for r in rows] == [(0, "time budget"), (2, "time budget")]
    with pytest.raises(ValueError, match="--budget-s: expected seconds >= 0, got -1"):
        oryx_speculative.main(["--presets", "oryx-mamba2-tiny", "--budget-s", "-1"])
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["a/run", "b/run"], r"run directories: expected distinct .* \['run'\] more than once"),
    (["run", "--baselines", "x/attention"],
     r"--baselines: expected names other than \['attention', 'linear', 'switching'\], got "
     r"\['attention'\]"),
    (["run", "--baselines", "a/gdn", "b/gdn"], r"--baselines: expected distinct .* \['gdn'\]"),
    (["baselines"], r"run directories: expected names other than \['switches', 'baselines'\]"),
    (["run", "--switch", "5,x"], r"--switch: expected positions separated by commas, got '5,x'"),
    (["run", "--batches", "-1"], r"--batches: expected 0 \(all\) or more, got -1"),
])
def test_switch_main_refuses_bad_arguments_before_loading(tmp_path, monkeypatch, argv,
                                                          message):
    """Results are keyed by directory name: a clash replaced one run's curves by another's (a
    baseline `runs/attention` took the place of the all-attention schedule in the segments)."""
    monkeypatch.setattr(oryx_switch, "_model_and_batches", None)  # never reached
    with pytest.raises(ValueError, match=message):
        switch_main([*argv, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("task, oryx", [("mqar4", "mqar4-oryx-gdn-tiny"),
                                        ("needle", "needle-oryx-gdn-tiny"),
                                        ("lm-wikitext2", "lm-wikitext2-oryx-gdn-tiny")])
def test_baselines_train_like_their_oryx_run(task, oryx):
    """Same data, vocabulary, width and training as the Oryx run; no modes, no Oryx layer."""
    reference = registry.get(oryx)
    assert is_oryx(reference.model) and reference.train.mode_schedule.pattern == "random_chunks"
    for preset in BASELINES:
        baseline = registry.get(f"{task}-baseline-{preset}")
        assert not is_oryx(baseline.model) and baseline.data == reference.data
        assert baseline.train.mode_schedule.pattern == "none"
        assert dataclasses.replace(baseline.train, mode_schedule=reference.train.mode_schedule) \
            == reference.train
        assert (baseline.model.vocab_size, baseline.model.d_model) == (
            reference.model.vocab_size, reference.model.d_model)


@pytest.mark.slow
def test_scripts_on_a_tiny_oryx_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main(["train", "mqar-oryx-gdn-tiny", "--out", str(run), "--quiet",
                     *TINY_RUN]) == 0
    assert modes_main([str(run), "--batches", "1"]) == 0
    modes = json.loads((run / "modes.json").read_text())
    assert modes["linear"]["attention_fraction"] == 0
    assert modes["linear + attention on the queries"]["attention_fraction"] == 2 / 16
    baseline = tmp_path / "baseline"
    assert cli_main(["train", "mqar-gdn-tiny", "--out", str(baseline), "--quiet",
                     *TINY_RUN]) == 0
    assert modes_main([str(baseline), "--batches", "1"]) == 0
    single = json.loads((baseline / "modes.json").read_text())
    assert list(single) == [SINGLE_MIXER] and single[SINGLE_MIXER]["attention_fraction"] == 0
    assert switch_main([str(run), "--switch", "5,11", "--batches", "1", "--baselines",
                        str(baseline), "--out", str(tmp_path / "switch")]) == 0
    switch = json.loads((tmp_path / "switch" / "switch.json").read_text())
    assert switch["switches"] == [5, 11] and len(switch[run.name]["curves"]["linear"]) == 16
    assert len(switch["baselines"]["baseline"]) == 16
    assert all("baseline" in row for row in switch[run.name]["segments"])
    assert (tmp_path / "switch" / "switch.png").stat().st_size > 0
    out = tmp_path / "speculative.json"
    assert oryx_speculative.main([str(run), "--k", "2", "--batch", "2", "--prompt-len", "4",
                                  "--new-tokens", "6", "--presets", "oryx-mamba2-tiny",
                                  "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["decoding"], r["k"]) for r in rows] == [("attention", 0), ("speculative", 2)] * 2
    assert all(r["identical"] for r in rows) and 0 <= rows[1]["acceptance"] <= 1
    capsys.readouterr()


class _PositionLogits(nnx.Module):
    """Logits that depend on the position, the row's token and (when given) the mode: a model
    whose per-position losses numpy can compute."""

    def __init__(self, T, V, uses_modes=True):
        self.table = nnx.Param(jax.random.normal(jax.random.key(0), (2, T, V)))
        self.uses_modes = uses_modes

    def __call__(self, inputs, ctx):
        mode = ctx.extra(MODE) if self.uses_modes else jnp.zeros_like(inputs)
        return self.table[mode, jnp.arange(inputs.shape[1])] + 0.1 * inputs[..., None]


def _numpy_position_losses(table, batches, modes_T):
    total, count = 0.0, 0.0
    for batch in batches:
        logits = table[modes_T, np.arange(len(modes_T))] + 0.1 * batch["inputs"][..., None]
        nll = (np.log(np.exp(logits).sum(-1))
               - np.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0])
        total, count = total + (nll * batch["mask"]).sum(0), count + batch["mask"].sum(0)
    with np.errstate(invalid="ignore"):
        return total / count  # 0 / 0: NaN where never scored


def _batches(T, V):
    rng = np.random.default_rng(0)
    batches = []
    for rows in (3, 2):  # two batches of different sizes; each masks different positions
        batches.append({"inputs": rng.integers(0, V, (rows, T)).astype(np.int32),
                        "targets": rng.integers(0, V, (rows, T)).astype(np.int32),
                        "mask": (rng.random((rows, T)) < 0.7).astype(np.int32),
                        "target_bytes": np.ones((rows, T), np.int32)})
    batches[0]["mask"][:, 0] = 0  # position 0 is scored in the second batch only
    batches[1]["mask"][:, -1] = 0
    batches[0]["mask"][:, -1] = 0  # the last position is never scored: NaN, not a loss of 0
    return batches


def test_position_losses_are_masked_means_over_rows_and_batches():
    T, V = 12, 7
    model, batches = _PositionLogits(T, V), _batches(T, V)
    modes = switch_modes(T, [4, 9])
    want = _numpy_position_losses(np.asarray(model.table[...]), batches, modes)
    for batch in batches:  # unscored targets outside the vocabulary (-100 padding) are not read
        batch["targets"][batch["mask"] == 0] = -100
    got = oryx_switch.position_losses(model, batches, modes)
    assert got.shape == (T,) and np.isnan(got[-1]) and not np.isnan(got[:-1]).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_switch_json_keeps_the_runs_before_a_failure(tmp_path, monkeypatch, capsys):
    """switch.json was written once, after every run: a failing run lost those before it."""
    T, V = 12, 7

    def model_and_batches(run_dir, num):
        if run_dir.name == "broken":
            raise FileNotFoundError("broken: no checkpoint")
        return _PositionLogits(T, V), _batches(T, V)

    monkeypatch.setattr(oryx_switch, "_model_and_batches", model_and_batches)
    with pytest.raises(FileNotFoundError, match="broken: no checkpoint"):
        switch_main([str(tmp_path / "run"), str(tmp_path / "broken"), "--switch", "3,7",
                     "--out", str(tmp_path / "out")])
    written = json.loads((tmp_path / "out" / "switch.json").read_text())
    assert sorted(written) == ["baselines", "run", "switches"]
    assert len(written["run"]["curves"]["switching"]) == T
    capsys.readouterr()


def test_switch_main_writes_each_schedule_under_its_own_name(tmp_path, monkeypatch):
    """The curves of "linear" are those of the all-linear modes (and so on), and the
    baselines' curves (a model without modes) join every run's segments."""
    T, V = 12, 7
    model, baseline, batches = _PositionLogits(T, V), _PositionLogits(T, V, False), _batches(T, V)
    models = {"run": model, "base": baseline}
    monkeypatch.setattr(oryx_switch, "_model_and_batches",
                        lambda run_dir, num: (models[run_dir.name], batches))
    monkeypatch.setattr(oryx_switch, "plot", lambda *args: None)
    assert switch_main([str(tmp_path / "run"), "--switch", "3,7", "--baselines",
                        str(tmp_path / "base"), "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "switch.json").read_text())
    table = np.asarray(model.table[...])
    expected = {"attention": np.full(T, ATTENTION), "linear": np.full(T, LINEAR),
                "switching": switch_modes(T, [3, 7])}
    for name, modes in expected.items():
        np.testing.assert_allclose(np.asarray(written["run"]["curves"][name], float),
                                   _numpy_position_losses(table, batches, modes), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    base = np.asarray(written["baselines"]["base"], float)
    np.testing.assert_allclose(base, _numpy_position_losses(
        np.asarray(baseline.table[...]), batches, np.zeros(T, np.int32)), rtol=1e-5, atol=1e-6)
    # The last position, never scored, is null (it was a loss of 0) and left out of its
    # segment's mean (which it pulled down).
    assert written["run"]["curves"]["linear"][-1] is None
    assert written["baselines"]["base"][-1] is None
    segments_ = written["run"]["segments"]
    assert [row["positions"] for row in segments_] == [[0, 3], [3, 7], [7, 12]]
    assert segments_[0]["base"] == pytest.approx(np.mean(base[:3]))
    assert segments_[2]["base"] == pytest.approx(np.mean(base[7:11]))
    assert written["switches"] == [3, 7]


def test_segments_shorter_than_the_settling_window():
    """A segment of fewer than SETTLE tokens is one row, cut at the next switch."""
    rows = segments({"a": np.arange(30.0)}, [5, 20])  # [0, 5) [5, 13) [13, 20) [20, 28) [28, 30)
    assert [r["positions"] for r in rows] == [[0, 5], [5, 13], [13, 20], [20, 28], [28, 30]]
    assert [r["a"] for r in rows] == [2.0, 8.5, 16.0, 23.5, 28.5]


@pytest.mark.parametrize("switch, problem", [("176,96", "increasing"), ("5,5", "increasing"),
                                             ("0,7", "between 1 and 11"),
                                             ("5,12", "between 1 and 11")])
def test_switch_positions_out_of_order_or_range_are_refused(switch, problem):
    """Unsorted switches made all-attention rows silently (the later switch undid the
    earlier one); one at T made a segment of no tokens (a NaN mean)."""
    switches = [int(x) for x in switch.split(",")]
    with pytest.raises(ValueError, match=problem):
        switch_modes(12, switches)
    with pytest.raises(ValueError, match=problem):
        segments({"a": np.zeros(12)}, switches)


def _stub_modes_run(monkeypatch, preset):
    """run_modes on the registered `preset` with restoring and evaluating stubbed: the stub's
    stats name the schedule they were asked for."""
    calls = []

    def evaluate(ts, held_out, modes=None):
        calls.append(modes)
        fraction = {None: -1.0, "linear": 0.0, "attention": 1.0}.get(modes, 0.25)
        return {"accuracy": 0.5 + fraction / 4, "loss": 2.0 - fraction,
                "attention_fraction": fraction}

    monkeypatch.setattr(oryx_modes, "read_experiment", lambda path: registry.get(preset))
    monkeypatch.setattr(oryx_modes, "restore_train_state", lambda *args: (None, None))
    monkeypatch.setattr(oryx_modes, "make_mesh", lambda mesh: None)
    monkeypatch.setattr(oryx_modes, "bind_data", lambda *args, **kwargs: None)
    monkeypatch.setattr(oryx_modes, "held_out_set", lambda *args: ([], None))
    monkeypatch.setattr(oryx_modes, "evaluate", evaluate)
    return calls


def test_modes_rows_are_the_schedules_they_name(tmp_path, monkeypatch, capsys):
    calls = _stub_modes_run(monkeypatch, "mqar-oryx-gdn-tiny")
    assert modes_main([str(tmp_path), "--out", str(tmp_path / "all.json")]) == 0
    assert calls == ["linear", "attention", "scored=attention,other=linear"]
    written = json.loads((tmp_path / "modes.json").read_text())
    assert written == {
        "linear": {"recall": 0.5, "loss": 2.0, "attention_fraction": 0.0},
        "attention": {"recall": 0.75, "loss": 1.0, "attention_fraction": 1.0},
        "linear + attention on the queries": {"recall": 0.5625, "loss": 1.75,
                                              "attention_fraction": 0.25}}
    assert json.loads((tmp_path / "all.json").read_text()) == {str(tmp_path): written}
    (tmp_path / "modes.json").unlink()  # with --set (other data): not the run's modes.json
    assert modes_main([str(tmp_path), "--set", "data.seq_len=64"]) == 0
    assert not (tmp_path / "modes.json").exists()
    capsys.readouterr()


def test_modes_out_keeps_the_runs_before_a_failure(tmp_path, monkeypatch, capsys):
    """--out was written once, at the end: a run failing after hours of others lost them all
    (with --set no run's modes.json holds them either). A repeated run is refused."""
    row = {"linear": {"recall": 0.5, "loss": 2.0, "attention_fraction": 0.0}}

    def run_modes(run_dir, batches, overrides):
        if run_dir.name == "b":
            raise FileNotFoundError("b: no checkpoint")
        return row

    monkeypatch.setattr(oryx_modes, "run_modes", run_modes)
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "all.json"
    with pytest.raises(FileNotFoundError, match="b: no checkpoint"):
        modes_main([str(a), str(b), "--set", "data.seq_len=64", "--out", str(out)])
    assert json.loads(out.read_text()) == {str(a): row}
    with pytest.raises(ValueError, match=r"run directories: \[.*a'\] given more than once"):
        modes_main([str(a), str(b), str(a)])
    with pytest.raises(ValueError, match=r"--batches: expected 0 \(all\) or more, got -2"):
        modes_main([str(a), "--batches", "-2"])
    capsys.readouterr()


@pytest.mark.parametrize("preset, fraction", [("mqar4-baseline-transformer-tiny", 1.0),
                                              ("mqar4-baseline-gdn-tiny", 0.0)])
def test_single_mixer_row(tmp_path, monkeypatch, preset, fraction):
    calls = _stub_modes_run(monkeypatch, preset)
    assert oryx_modes.run_modes(tmp_path, 1) == {
        SINGLE_MIXER: {"recall": 0.25, "loss": 3.0, "attention_fraction": fraction}}
    assert calls == [None]


def test_a_hybrid_without_oryx_layers_is_refused(tmp_path, monkeypatch):
    """It was reported as a single mixer with attention fraction 0."""
    _stub_modes_run(monkeypatch, "mqar4-baseline-gdn-tiny")
    hybrid = registry.get("mqar4-baseline-gdn-tiny")
    hybrid = dataclasses.replace(hybrid, model=hybrid.model.replace(
        layers=(layer("gdn"), layer("attention"))))
    monkeypatch.setattr(oryx_modes, "read_experiment", lambda path: hybrid)
    with pytest.raises(ValueError, match=r"expected one layer type, found \['attention', 'gdn'\]"):
        oryx_modes.run_modes(tmp_path, 1)
