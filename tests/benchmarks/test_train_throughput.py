"""train_throughput: its same-run ratio columns, and a tiny row through `main()` on CPU."""

import json

import pytest

from experiments.benchmarks.train_throughput import (
    add_ratios,
    build_step,
    has_modes,
    main,
    model_config,
    with_full_window_nha,
)


def test_ratios_against_the_baseline_and_the_torch_peer():
    row = lambda model, tps, **kw: {"model": model, "T": kw.pop("T", 8), "data": "text",  # noqa: E731
                                    "scan": False, "remat": "none", "attn": "auto",
                                    "conv": "auto", "impl": "jax", "tokens_per_s": tps, **kw}
    rows = [{"model": "t", "T": 8, "data": "random (torch)", "impl": "torch",
             "tokens_per_s": 50.0},
            row("t", 100.0), row("g", 150.0), row("g", 60.0, scan=True),  # no scanned baseline
            row("t", 80.0, attn="pallas"),  # a forced rung is no baseline, but is compared
            row("t", 10.0, T=16), row("g", 30.0, T=16), {"model": "g", "T": 8, "error": "OOM"}]
    add_ratios(rows, "t")
    assert "vs_base" not in rows[0] and "vs_torch" not in rows[0]
    assert rows[1]["vs_base"] == 1.0 and rows[1]["vs_torch"] == pytest.approx(2.0)
    assert rows[2]["vs_base"] == pytest.approx(1.5) and "vs_torch" not in rows[2]
    assert "vs_base" not in rows[3]
    assert rows[4]["vs_base"] == pytest.approx(0.8) and rows[4]["vs_torch"] == pytest.approx(1.6)
    assert rows[6]["vs_base"] == pytest.approx(3.0) and "vs_torch" not in rows[5]
    assert "vs_base" not in rows[7]
    rows = [row("t", 100.0), row("n", 90.0), row("n", 120.0, nha="attention")]
    add_ratios(rows, "n")  # a forced NHA rung is no baseline either
    assert rows[1]["vs_base"] == 1.0 and rows[2]["vs_base"] == pytest.approx(120 / 90)


def test_only_full_window_nha_layers_are_forced():
    forced = with_full_window_nha(model_config("nha-hybrid-tiny"), "attention").layers
    assert [dict(spec.options).get("implementation") for spec in forced] == [None, "attention"]
    assert with_full_window_nha(model_config("nha-tiny"), "attention").layers == \
        model_config("nha-tiny").layers


def test_two_tiny_models_run_end_to_end_with_their_ratio(tmp_path, capfd):
    """Synthetic packed documents, no peer: each row trains, and the table prints the second
    model's tokens/s over the first's."""
    out = tmp_path / "tt.json"
    assert main(["--models", "transformer-tiny,gdn-tiny", "--lengths", "32", "--tokens", "256",
                 "--steps", "1", "--torch", "", "--unpacked", "", "--no-scan",
                 "--matmul-size", "128", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["transformer-tiny", "gdn-tiny"]
    assert all("error" not in r and r["tokens_per_s"] > 0 for r in rows), rows
    assert rows[0]["vs_base"] == 1.0
    assert rows[1]["vs_base"] == pytest.approx(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"])
    header = next(line.split() for line in capfd.readouterr().out.splitlines()
                  if line.startswith("model "))
    assert "vs_base" in header and "vs_torch" in header


def test_oryx_rows_train_under_the_mode_schedule_they_name():
    """The schedule reaches the step (linear and attention mode give different losses on the
    same batch and weights) and the row records it; only Oryx models have modes."""
    losses = {}
    for modes in ("linear", "attention"):
        built = build_step("oryx-gdn-tiny", 32, tokens=256, data="", remat="none", scan=False,
                           packed=True, modes=modes)
        assert built.info["modes"] == modes
        _, metrics = built.step(built.state, built.batches[0])
        losses[modes] = float(metrics["loss"])
    assert losses["linear"] != pytest.approx(losses["attention"], rel=1e-4), losses
    assert has_modes(model_config("oryx-mamba2-tiny"))
    assert not has_modes(model_config("transformer-tiny"))
    with pytest.raises(ValueError, match="pattern"):
        build_step("oryx-gdn-tiny", 32, tokens=256, data="", remat="none", scan=False,
                   packed=True, modes="sometimes")


def test_kernel_changes_reach_every_row_and_the_json(tmp_path, monkeypatch):
    """`--kernel-changes`: the kernels' default tiles are changed while the rows run, restored
    afterwards, and the JSON records the changes."""
    import experiments.benchmarks.train_throughput as throughput
    from pallas_kernels.ssd import api

    original, seen, run_one = api.default_block_sizes, [], throughput.run_one
    monkeypatch.setattr(throughput, "run_one", lambda *a, **kw: seen.append(
        api.default_block_sizes(64, 128)) or run_one(*a, **kw))
    out = tmp_path / "t.json"
    assert main(["--models", "transformer-tiny", "--lengths", "32", "--tokens", "64",
                 "--steps", "1", "--torch", "", "--unpacked", "", "--matmul-size", "128",
                 "--kernel-changes", "ssd:grads_num_stages=2,grads_summed_scores=False",
                 "--out", str(out)]) == 0
    assert len(seen) == 1 and seen[0].grads_num_stages == 2 and not seen[0].grads_summed_scores
    assert api.default_block_sizes is original
    assert json.loads(out.read_text())["kernel_changes"] == {
        "ssd": {"grads_num_stages": 2, "grads_summed_scores": False}}


@pytest.mark.parametrize("text", ["gsa:chunk=64", "ssd", "ssd:", "ssd:nope=1"])
def test_bad_kernel_changes_are_refused_with_what_was_expected(text):
    import argparse

    from experiments.benchmarks.timing import parse_kernel_changes

    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse_kernel_changes(text)
