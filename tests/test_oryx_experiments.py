"""The Oryx experiment scripts: mode schedules and segments (default), and end to end on a
2-step tiny run (slow): oryx_modes, oryx_switch and the speculative-decoding benchmark."""

import dataclasses
import json

import numpy as np
import pytest

from experiments import registry
from experiments.benchmarks import oryx_speculative
from experiments.cli import main as cli_main
from experiments.configs.oryx import BASELINES
from experiments.oryx_modes import SINGLE_MIXER, is_oryx
from experiments.oryx_modes import main as modes_main
from experiments.oryx_switch import main as switch_main
from experiments.oryx_switch import segments, switch_modes
from hybrid_jax.nn.oryx import ATTENTION, LINEAR
from tests.test_cli import TINY_RUN


def test_switch_modes_and_segments():
    modes = switch_modes(10, [3, 7])
    assert modes.tolist() == [ATTENTION] * 3 + [LINEAR] * 4 + [ATTENTION] * 3
    curves = {"a": np.arange(20.0), "b": np.zeros(20)}
    rows = segments(curves, [12])  # SETTLE = 8: [0, 8) [8, 12) [12, 20)
    assert [r["positions"] for r in rows] == [[0, 8], [8, 12], [12, 20]]
    assert [r["a"] for r in rows] == [3.5, 9.5, 15.5] and all(r["b"] == 0 for r in rows)


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
