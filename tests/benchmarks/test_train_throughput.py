"""train_throughput: its same-run ratio columns, and a tiny row through `main()` on CPU."""

import json

import numpy as np
import pytest

from experiments.benchmarks.train_throughput import (
    add_ratios,
    build_step,
    flops_columns,
    has_modes,
    main,
    model_config,
    with_full_window_nha,
)
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.flops import step_flops
from tests.helpers import FakeClock


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


def test_ratios_pair_rows_of_the_same_data():
    """Unpacked random-token rows are compared with the baseline's unpacked row, packed text
    rows with its packed one."""
    row = lambda model, tps, data: {"model": model, "T": 8, "data": data, "scan": False,  # noqa: E731
                                    "remat": "none", "attn": "auto", "conv": "auto",
                                    "impl": "jax", "tokens_per_s": tps}
    rows = [row("t", 100.0, "text"), row("t", 200.0, "random, unpacked"),
            row("g", 150.0, "text"), row("g", 50.0, "random, unpacked")]
    add_ratios(rows, "t")
    assert [r["vs_base"] for r in rows] == [1.0, 1.0, 1.5, 0.25]


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


def test_flops_columns_by_hand():
    """transformer-tiny (2 layers, 4 heads of 16): 4·64 FLOPs a visible (query, key) pair a
    layer; two batches of 2 rows of 8 tokens, one document a row (36 pairs) and two of 4 (20
    pairs): the model count is their mean; 6N is 3 × the matmul count; MFU against the peak
    and the same-run matmul."""
    config = model_config("transformer-tiny")
    matmul = step_flops(config, 8).matmul
    one, two = np.zeros((2, 8), np.int32), np.repeat([[0, 1]], 4, axis=1).repeat(2, axis=0)
    host = [{"inputs": one, "segment_ids": one}, {"inputs": one, "segment_ids": two}]
    row = flops_columns(config, host, seconds=0.5, peak=1e15, matmul_tflops=4.0)
    model = 3 * (matmul + 2 * 4 * 64 * (36 / 8 + 20 / 8) / 2)
    per_s = 2 * 8 / 0.5
    assert row["tflops"] == pytest.approx(model * per_s / 1e12, rel=1e-12)
    assert row["tflops_6n"] == pytest.approx(3 * matmul * per_s / 1e12, rel=1e-12)
    assert row["mfu_6n"] == pytest.approx(3 * matmul * per_s / 1e15, rel=1e-12)
    assert row["mfu_model"] == pytest.approx(model * per_s / 1e15, rel=1e-12)
    assert row["mfu_6n_matmul"] == pytest.approx(3 * matmul * per_s / 1e12 / 4.0, rel=1e-12)
    assert row["mfu_model_matmul"] == pytest.approx(model * per_s / 1e12 / 4.0, rel=1e-12)
    assert flops_columns(config, host, 0.5, None, 4.0)["mfu_6n"] is None


def test_run_one_times_the_steps_after_the_warm_up_up_to_the_devices_wait(monkeypatch):
    """Two warm-up steps (10 s each) outside the time; 4 timed steps of 0.25 s dispatch and
    the device's 0.5 s still to wait when the last loss is read: 1.5 s / 4 steps. 100 tokens a
    step at T 32 is a batch of 3 rows: 96 tokens."""
    import argparse

    import experiments.benchmarks.train_throughput as throughput

    clock = FakeClock()
    monkeypatch.setattr(throughput, "time", clock)

    class Loss:
        def __float__(self):
            clock.now += 0.5
            return 2.0

    durations = iter([10.0, 10.0] + [0.25] * 4)

    def step(state, batch):
        clock.now += next(durations)
        return state, {"loss": Loss()}

    built = throughput.Built(config=None, step=step, state=0, host=[], batches=[0, 1, 2, 3],
                             info={"compile_s": 1.0, "mem_GiB": 0.5}, params=None)
    monkeypatch.setattr(throughput, "build_step", lambda *a, **kw: built)
    seen = []
    monkeypatch.setattr(throughput, "flops_columns",
                        lambda config, host, seconds, *a: seen.append(seconds) or {})
    args = argparse.Namespace(scan=False, tokens=100, remat="none", conv=None, nha=None,
                              data="", oryx_modes="random_chunks", steps=4, peak=None,
                              matmul_tflops=1.0)
    row = throughput.run_one("transformer-tiny", 32, args, packed=True)
    assert seen == [0.375] and row["step_ms"] == 375.0
    assert row["B"] == 3 and row["tokens_per_s"] == 96 / 0.375 and row["loss"] == 2.0
    assert (row["compile_s"], row["mem_GiB"]) == (1.0, 0.5) and "error" not in row


def test_torch_peer_runs_the_rows_shape_and_reads_its_numbers(monkeypatch):
    import argparse
    import types

    import experiments.benchmarks.train_throughput as throughput

    commands = []
    line = json.dumps({"compile_s": 1.5, "step_ms": 2.5, "tokens_per_s": 3.5, "peak_GiB": 4.5})
    monkeypatch.setattr(throughput.subprocess, "run", lambda command, **kw: commands.append(
        command) or types.SimpleNamespace(stdout="torch 2.x\n" + line + "\n", stderr=""))
    row = throughput.torch_peer("transformer-tiny", 32, argparse.Namespace(tokens=64, steps=5))
    flag = lambda name: commands[0][commands[0].index(name) + 1]  # noqa: E731
    config = model_config("transformer-tiny")
    assert (flag("--batch"), flag("--length"), flag("--steps")) == ("2", "32", "5")
    assert (flag("--layers"), flag("--d-model"), flag("--heads"), flag("--ffn")) == (
        "2", "64", "4", str(config.resolved_ffn_dim))
    assert row == {"model": "transformer-tiny", "T": 32, "B": 2, "data": "random (torch)",
                   "impl": "torch", "compile_s": 1.5, "step_ms": 2.5, "tokens_per_s": 3.5,
                   "mem_GiB": 4.5}


def test_memory_is_arguments_and_temporaries():
    import types

    from experiments.benchmarks.train_throughput import _memory_gib

    analysis = types.SimpleNamespace(argument_size_in_bytes=2**30, temp_size_in_bytes=2**29)
    assert _memory_gib(types.SimpleNamespace(memory_analysis=lambda: analysis)) == 1.5


def test_matmul_tflops_counts_two_flops_a_multiply_add(monkeypatch):
    import types

    import experiments.benchmarks.train_throughput as throughput

    times = iter([0.0, 2.0])
    monkeypatch.setattr(throughput, "time", types.SimpleNamespace(
        perf_counter=lambda: next(times)))
    # 20 products of 8 × 8 matrices in 2 s, 8 · 8 · 8 multiply-adds each
    assert throughput.matmul_tflops(8) == 20 * 8 * 8 * 8 * 2 / 2.0 / 1e12


def test_the_peak_and_the_matmul_reach_the_rows_and_the_json(tmp_path, monkeypatch):
    import experiments.benchmarks.train_throughput as throughput

    monkeypatch.setattr(throughput, "device_peak_flops", lambda: 1e15)
    monkeypatch.setattr(throughput, "matmul_tflops", lambda size: 250.0)
    out = tmp_path / "t.json"
    assert main(["--models", "transformer-tiny", "--lengths", "32", "--tokens", "256",
                 "--steps", "1", "--torch", "", "--unpacked", "", "--matmul-size", "128",
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())  # (batch 8: one row a CPU device)
    assert (record["peak_tflops"], record["matmul_tflops"], record["matmul_size"]) == (
        1000.0, 250.0, 128)
    [row] = record["rows"]
    assert row["mfu_6n"] == pytest.approx(row["tflops_6n"] / 1000.0)
    assert row["mfu_model_matmul"] == pytest.approx(row["tflops"] / 250.0)
    assert row["tokens_per_s"] == pytest.approx(256 / (row["step_ms"] / 1e3))


def test_torch_peer_refuses_a_model_it_does_not_build(monkeypatch):
    """The peer is a plain multi-head transformer with tied embeddings: for another model
    (GDN layers, GQA, untied) its row says so instead of timing a different model under the
    same name (a vs_torch against it compared unlike models)."""
    import argparse

    import experiments.benchmarks.train_throughput as throughput

    monkeypatch.setattr(throughput.subprocess, "run", lambda *a, **kw: pytest.fail("ran"))
    args = argparse.Namespace(tokens=64, steps=5)
    for name, why in (("gdn-tiny", "gdn"), ("llama-40m", "num_kv_heads")):
        row = throughput.torch_peer(name, 32, args)
        assert "tokens_per_s" not in row and why in row["error"], row


def test_a_torch_peer_past_its_time_limit_is_a_row_not_the_end_of_the_run(monkeypatch):
    import argparse
    import subprocess

    import experiments.benchmarks.train_throughput as throughput

    def run(command, **kw):
        raise subprocess.TimeoutExpired(command, kw["timeout"], output=b"", stderr=b"compiling")

    monkeypatch.setattr(throughput.subprocess, "run", run)
    row = throughput.torch_peer("transformer-tiny", 32, argparse.Namespace(tokens=64, steps=5))
    assert "timed out" in row["error"] and "tokens_per_s" not in row


def test_flops_columns_count_oryx_under_its_schedule_and_name_what_is_uncounted():
    """Oryx's attention counts the schedule's share of its rows; a row whose model has a
    Mamba-1 layer says its sequence work is not in the model count."""
    host = [{"inputs": np.zeros((2, 8), np.int32)}]  # 16 tokens a second below
    oryx = model_config("oryx-gdn-tiny")
    for modes, fraction in (("linear", 0.0), ("random_chunks", 0.5), ("attention", 1.0)):
        row = flops_columns(oryx, host, 1.0, None, 1.0, modes=modes)
        per_token = step_flops(oryx, 8, attention_fraction=fraction).training_per_token()
        assert row["tflops"] * 1e12 == pytest.approx(16 * per_token, rel=1e-12)
        assert row["uncounted"] is None
    mamba1 = ModelConfig(layers=(layer("mamba1"), "attention"), vocab_size=16, d_model=32,
                         num_heads=2)
    assert flops_columns(mamba1, host, 1.0, None, 1.0)["uncounted"] == "mamba1"
