"""The `hybrid-jax` command end to end on a tiny run: train, eval, generate, list, errors."""

import json

import pytest

from experiments.cli import main
from experiments.run import read_experiment
from hybrid_jax.flops import step_flops

TINY_RUN = ["--set", "train.steps=6", "--set", "train.warmup_steps=2",
            "--set", "train.batch_size=8", "--set", "train.log_every=2",
            "--set", "train.eval_batches=1", "--set", "data.seq_len=16",
            "--set", "data.num_kv_pairs=2", "--set", "train.mesh.data=1", "--set",
            "model.d_model=16", "--set", "model.num_heads=2", "--set", "train.peak_tflops=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "mqar-transformer-tiny", "--out", str(out), "--quiet", *TINY_RUN]) == 0
    return out


def test_train_writes_the_run_directory(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["steps"] == 6 and config["model"]["d_model"] == 16
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [2, 4, 6]
    assert all(x["loss"] > 0 and x["tokens_per_s"] > 0 for x in lines if "loss" in x)
    # MFU by 6N (of record) and by the model count (6N + attention): the second is larger.
    assert all(0 < x["mfu"] < x["mfu_model"] for x in lines if "loss" in x)
    assert all(x["tflops_per_device"] == pytest.approx(x["mfu_model"]) for x in lines
               if "loss" in x)
    # The FLOPs of both steps of a log interval, per device of the mesh's one (of 8), at the
    # count of hybrid_jax.flops (MQAR rows are one document each; test_rates: packed text).
    per_token = step_flops(read_experiment(run_dir / "config.json").model, 16)
    assert all(x["tflops_per_device"] * 1e12 == pytest.approx(
        per_token.training_per_token() * x["tokens_per_s"]) for x in lines if "loss" in x)
    results = json.loads((run_dir / "results.json").read_text())
    assert 0 <= results["accuracy"] <= 1 and results["steps"] == 6
    assert (run_dir / "checkpoints" / "6").is_dir()


def test_eval_reproduces_the_final_metrics(run_dir, capsys):
    results = json.loads((run_dir / "results.json").read_text())
    assert main(["eval", str(run_dir)]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[0])
    assert metrics["accuracy"] == pytest.approx(results["eval_accuracy"])
    assert metrics["loss"] == pytest.approx(results["eval_loss"], rel=1e-5)


def test_eval_with_oryx_modes_reports_attention_tokens_and_cache(tmp_path, capsys):
    """MQAR of 2 pairs in 16 tokens: attention on the 2 scored query tokens = 1/8 of them."""
    out = tmp_path / "oryx"
    assert main(["train", "mqar-oryx-gdn-tiny", "--out", str(out), "--quiet", *TINY_RUN]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--modes", "scored=attention,other=linear"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out.splitlines()[0])
    assert metrics["attention_fraction"] == pytest.approx(2 / 16)
    assert 0 < metrics["cache_kv_bytes"] < metrics["cache_bytes"]
    assert "decode cache for one held-out batch" in captured.err


def test_generate_is_greedy_and_deterministic(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt-ids", "3 5 7", "--max-new-tokens", "5"]) == 0
    first = capsys.readouterr().out.split()
    assert len(first) == 5 and all(0 <= int(t) < 256 for t in first)
    main(["generate", str(run_dir), "--prompt-ids", "3,5,7", "--max-new-tokens", "5"])
    assert capsys.readouterr().out.split() == first


def test_list_shows_presets_blocks_experiments(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("presets:", "transformer-125m", "block types:", "attention", "experiments:",
                 "mqar-transformer-tiny"):
        assert word in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["train", "mqar-transformer-tiny", "--set", "model.num_heads=5"],
         "num_heads=5 does not divide d_model=64"),
        (["eval", "/nonexistent/run"], "config.json not found"),
        (["eval", "/nonexistent/run", "--layers", "0"], "--layers only apply with --windows"),
        (["eval", "/nonexistent/run", "--sweep-out", "x"], "--sweep-out only apply with --windows"),
        (["eval", "/nonexistent/run", "--windows", "4", "--modes", "linear"],
         "--modes and --windows: the window sweep runs the model's own modes"),
        (["train", "mqar-transformer-tiny", "--set", "data.vocab_size=512"],
         "data.vocab_size=512 exceeds model.vocab_size=256"),
        (["train", "mqar-transformer-tiny", "--set", "train.batch_size=4", "--set",
          "train.mesh.data=2", "--set", "train.mesh.fsdp=4"],
         "train.batch_size=4 does not split over the mesh's batch axes (data 2 x fsdp 4 = 8 "
         "shards)"),
        (["train", "mqar-transformer-tiny", "--local-device-ids", "0,x"],
         "--local-device-ids expects integers, got 'x'"),
        (["scale", "mqar-transformer-tiny", "--devices", "1,x"],
         "--devices expects integers, got 'x'"),
        (["scale", "mqar-transformer-tiny", "--steps", "0"],
         "--steps=0: expected a finite value >= 1"),  # it compiled, then had no median
        (["scale", "mqar-transformer-tiny", "--time-limit", "-1"],
         "--time-limit=-1.0: expected a finite value >= 0"),
    ],
)
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
