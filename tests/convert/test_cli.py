"""`hybrid-jax import hf / generate --prompt / export hf / convert` end to end, and their
one-line errors."""

import json
import shutil
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.run import read_experiment
from hybrid_jax.config import MeshConfig, ModelConfig
from hybrid_jax.convert.params import write_conversion
from hybrid_jax.convert.run_dir import pretrained_experiment, write_run
from hybrid_jax.data.tokenizer import (
    ByteTokenizer,
    build_word_vocab,
    load_tokenizer,
    tokenizer_fingerprint,
)
from hybrid_jax.nn.lm import create_model
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.checkpoint import CheckpointError, saved_steps
from hybrid_jax.train.run_dir import RunDirError, RunLock
from hybrid_jax.train.trainer import restore_train_state
from tests.convert.test_hf import FIXTURES


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "llama"
    assert main(["import", "hf", str(FIXTURES / "llama"), "--out", str(out)]) == 0
    return out


def test_import_then_generate_text(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt", "the cat sat on the mat",
                 "--max-new-tokens", "6", "--no-stream"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the cat sat on the mat") and "tokens/s" in err


def test_train_without_resume_names_the_resume(run_dir, capsys):
    """An imported run's experiment (hf-llama) is no registered one: `train hf-llama --out RUN`
    without --resume said "unknown experiment 'hf-llama'" while RUN names it."""
    assert main(["train", "hf-llama", "--out", str(run_dir), "--set", "data.path=x.txt"]) == 2
    assert (f"{run_dir} holds a run of 'hf-llama' (an imported or converted model), which only "
            f"its run directory defines: continue it with `hybrid-jax train hf-llama --out "
            f"{run_dir} --resume`") in capsys.readouterr().err


def test_export_and_convert(run_dir, tmp_path, capsys):
    assert main(["export", "hf", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert main(["convert", str(run_dir), "--to", "nha", "--out", str(tmp_path / "nha"),
                 "--window", "full", "--slots", "4", "--scan-layers"]) == 0
    assert (tmp_path / "nha" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "nha" / "config.json").read_text())["model"]["scan_layers"]
    assert main(["convert", str(run_dir), "--to", "oryx", "--out", str(tmp_path / "oryx")]) == 0
    # Fine-tuning trains both modes (the default, attention, alone left the linear mode as
    # initialised): the source's schedule was "none".
    assert read_experiment(tmp_path / "oryx" / "config.json").train.mode_schedule.pattern == (
        "random_chunks")
    defaults = tmp_path / "nha-defaults"  # window 512, 64 slots
    assert main(["convert", str(run_dir), "--to", "nha", "--out", str(defaults)]) == 0
    options = read_experiment(defaults / "config.json").model.block_options(0)
    assert (options.window, options.num_slots) == (512, 64)
    assert main(["generate", str(tmp_path / "oryx"), "--prompt-ids", "3 4 5",
                 "--max-new-tokens", "4", "--speculative", "2"]) == 0
    err = capsys.readouterr().err
    assert "acceptance rate" in err
    # 3 prompt tokens + 4 new + room for the 2 drafts of the last round
    assert "decode cache for 1 x 9 tokens: " in err


def test_streaming_prints_what_the_batch_path_prints(run_dir, capsys):
    """One prompt streams: the prompt once, then each piece as it comes; the output is the
    --no-stream output. A batch never streams: each prompt and its text on one line. The
    decode-cache line names the batch and the longest prompt plus the new tokens. (--top-p 1
    and --top-k at the vocabulary size are the widest allowed values.)"""
    sampling = ["--temperature", "1", "--top-p", "1", "--top-k", "128", "--seed", "1"]
    runs = {}
    for name, prompts, extra in (("stream", ["the cat"], sampling),
                                 ("plain", ["the cat"], [*sampling, "--no-stream"]),
                                 ("batch", ["the cat", "a dog sat on it"], []),
                                 ("batch-plain", ["the cat", "a dog sat on it"],
                                  ["--no-stream"])):
        assert main(["generate", str(run_dir), *(a for p in prompts for a in ("--prompt", p)),
                     "--max-new-tokens", "6", *extra]) == 0
        runs[name] = capsys.readouterr()
    assert runs["stream"].out == runs["plain"].out
    assert runs["stream"].out.startswith("the cat") and runs["stream"].out.endswith("\n")
    assert runs["batch"].out == runs["batch-plain"].out
    assert runs["batch"].out.startswith("the cat") and "\na dog sat on it" in runs["batch"].out
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    one, longest = (len(tokenizer.encode_prompt(p)) for p in ("the cat", "a dog sat on it"))
    assert one < longest
    assert f"decode cache for 1 x {one + 6} tokens: " in runs["stream"].err
    assert f"decode cache for 2 x {longest + 6} tokens: " in runs["batch"].err


@pytest.mark.parametrize("args", [["--window", "8"], ["--slots", "4"]])
def test_convert_to_oryx_refuses_nha_options(run_dir, tmp_path, capsys, args):
    """They were ignored (the help said "unused")."""
    assert main(["convert", str(run_dir), "--to", "oryx", "--out", str(tmp_path / "o"),
                 *args]) == 2
    assert f"{args[0]}: NHA options; --to oryx takes none" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_convert_window_names_full_among_its_values(tmp_path, capsys):
    """A bad --window said "--window expects integers", leaving out the documented 'full'."""
    assert main(["convert", str(tmp_path / "run"), "--to", "nha", "--out", str(tmp_path / "o"),
                 "--window", "fulll"]) == 2
    assert ("--window expects an integer or 'full', got 'fulll'"
            in capsys.readouterr().err.strip())


@pytest.mark.parametrize("args,message", [
    (["--prompt-file", "/nonexistent/prompts.txt"], "--prompt-file /nonexistent/prompts.txt"),
    (["--prompt", "the cat " * 40], "longer than the model's 64 positions"),
    (["--prompt-ids", "5 " * 60, "--max-new-tokens", "8"], "longer than the model's 64 positions"),
])
def test_generate_errors_are_one_line(run_dir, capsys, args, message):
    assert main(["generate", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    # Only the error line, after the line naming the checkpoint step once one was loaded.
    lines = [line for line in err.strip().splitlines()
             if not line.startswith("generate: checkpoint step")]
    assert len(lines) == 1 and message in lines[0], err


def test_sampling_is_reproducible_from_the_seed(run_dir, capsys):
    outputs = []
    for seed in (3, 3, 4):
        assert main(["generate", str(run_dir), "--prompt", "the cat", "--temperature", "1",
                     "--top-p", "0.95", "--seed", str(seed), "--max-new-tokens", "8",
                     "--no-stream"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] != outputs[2]


def test_unknown_tokenizer_is_one_line(run_dir, tmp_path, capsys):
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "config.json").write_text((run_dir / "config.json").read_text())
    (bad / "tokenizer.json").write_text('{"hybrid_jax_tokenizer": "sentencepiece"}')
    assert main(["generate", str(bad), "--prompt", "x"]) == 2
    assert "unknown hybrid_jax_tokenizer 'sentencepiece'" in capsys.readouterr().err


def test_import_into_the_source_directory_is_refused_leaving_it_as_it_was(tmp_path, capsys):
    """It left a .lock there, after loading the whole model."""
    source = tmp_path / "llama"
    shutil.copytree(FIXTURES / "llama", source)
    before = sorted(p.name for p in source.iterdir())
    assert main(["import", "hf", str(source), "--out", str(source)]) == 2
    assert f"{source} already holds a run (config.json)" in capsys.readouterr().err
    assert sorted(p.name for p in source.iterdir()) == before


def test_export_refuses_before_loading_the_checkpoint(run_dir, tmp_path, capsys):
    """A non-empty --out, or a model Llama cannot describe, was refused after the load."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["export", "hf", str(run_dir), "--out", str(tmp_path / "full")]) == 2
    assert capsys.readouterr().err.startswith(f"hybrid-jax export: error: export: {tmp_path}/full"
                                              " is not an empty directory")
    hybrid = tmp_path / "hybrid"  # no checkpoint: a load would fail naming that
    hybrid.mkdir()
    config = json.loads((run_dir / "config.json").read_text())
    config["model"]["layers"] = ["mamba2", "attention"]
    (hybrid / "config.json").write_text(json.dumps(config))
    assert main(["export", "hf", str(hybrid), "--out", str(tmp_path / "hf")]) == 2
    assert "found 'mamba2' at layers [0]" in capsys.readouterr().err


def test_write_run_names_its_tokenizer_absolutely_and_never_overwrites(tmp_path, monkeypatch):
    """A run directory given relative to the working directory records its tokenizer by an
    absolute path (so eval / train --resume from elsewhere find it), and a write into a
    directory that holds a run's outputs (another conversion's, a trained run's) is refused."""
    monkeypatch.chdir(tmp_path)
    model = create_model(ModelConfig(layers=("attention",), vocab_size=32, d_model=16,
                                     num_heads=2, ffn_dim=32))
    experiment = pretrained_experiment("tiny", model.config, Path("run"), description="tiny")
    assert experiment.data.tokenizer == str(tmp_path / "run" / "tokenizer.json")
    write_run("run", experiment, model)
    assert saved_steps(tmp_path / "run") == [0]
    with pytest.raises(ValueError, match=r"run already holds a run \(config.json, checkpoints\):"
                                         " choose another --out"):
        write_run("run", experiment, model)
    # Another run's results alone: they would read as this model's.
    (tmp_path / "trained").mkdir()
    (tmp_path / "trained" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match=r"trained already holds a run \(metrics.jsonl\)"):
        write_run("trained", experiment, model)
    assert [p.name for p in (tmp_path / "trained").iterdir()] == ["metrics.jsonl"]  # no .lock
    # A directory a training process holds (its lock): refused, naming the holder.
    with RunLock(tmp_path / "busy"), pytest.raises(RunDirError, match="busy is in use by "
                                                                     "another run"):
        write_run("busy", experiment, model)
    assert not (tmp_path / "busy" / "checkpoints").exists()


def test_a_failed_write_run_leaves_no_half_written_run(tmp_path, monkeypatch):
    """A checkpoint save that fails (disk full, interrupted) removes what `write_run` wrote
    (the copied tokenizer, the partial checkpoints/), so the retry is not refused as holding a
    run; the directory itself when the call made it (it stayed, holding its .lock)."""
    import hybrid_jax.convert.run_dir as run_dir_module

    model = create_model(ModelConfig(layers=("attention",), vocab_size=32, d_model=16,
                                     num_heads=2, ffn_dim=32))
    ByteTokenizer().save(tmp_path / "tokenizer.json")
    run = tmp_path / "run"
    experiment = pretrained_experiment("tiny", model.config, run, description="tiny")

    def fail(self, *args):
        (self.directory / "0").mkdir(parents=True)
        raise OSError("disk full")

    monkeypatch.setattr(run_dir_module.Checkpointer, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        write_run(run, experiment, model, files=(tmp_path / "tokenizer.json",))
    assert not run.exists()
    run.mkdir()
    for directory in (tmp_path, run):  # a file of that name there before: not removed
        (directory / "generation_config.json").write_text("{}")
    with pytest.raises(OSError, match="disk full"):
        write_run(run, experiment, model, files=(tmp_path / "tokenizer.json",
                                                 tmp_path / "generation_config.json"))
    assert sorted(p.name for p in run.iterdir()) == [".lock", "generation_config.json"]
    monkeypatch.undo()
    write_run(run, experiment, model, files=(tmp_path / "tokenizer.json",))
    assert saved_steps(run) == [0]


def test_write_run_records_its_tokenizer_and_a_swapped_one_is_refused(tmp_path):
    """The step-0 checkpoint records the copied tokenizer.json's fingerprint, as a trained
    run's do: restoring with another tokenizer.json in its place is refused."""
    model = create_model(ModelConfig(layers=("attention",), vocab_size=300, d_model=16,
                                     num_heads=2, ffn_dim=32))
    run = tmp_path / "run"
    experiment = pretrained_experiment("tiny", model.config, run, description="tiny")
    source = tmp_path / "tokenizer.json"
    ByteTokenizer().save(source)
    write_run(run, experiment, model, files=(source,))
    mesh = make_mesh(MeshConfig(data=1))
    _, meta = restore_train_state(experiment, run, mesh)
    assert meta["tokenizer_sha256"] == tokenizer_fingerprint(ByteTokenizer())
    build_word_vocab(["a b c"]).save(run / "tokenizer.json")
    with pytest.raises(CheckpointError, match="is not the tokenizer checkpoint step 0 was "
                                              "trained with"):
        restore_train_state(experiment, run, mesh)


def test_a_conversion_takes_the_sources_files_but_not_its_results(tmp_path):
    """`write_conversion`: the source's tokenizer and Hugging Face JSON files come along, its
    config.json, results.json, metrics and any other file (an evaluation's modes.json: they
    describe the source model) do not; the new experiment is `<name>-<suffix>`, described as a
    conversion."""
    model = create_model(ModelConfig(layers=("attention",), vocab_size=32, d_model=16,
                                     num_heads=2, ffn_dim=32))
    source = tmp_path / "source"
    source.mkdir()
    for name in ("config.json", "results.json", "generation_config.json", "metrics.jsonl",
                 "hf_config.json", "modes.json"):
        (source / name).write_text(f'{{"file": "{name}"}}')
    ByteTokenizer().save(source / "tokenizer.json")  # loaded: the checkpoint records it
    experiment = pretrained_experiment("tiny", model.config, source, description="tiny")
    converted = write_conversion(experiment, model, source, tmp_path / "out", suffix="nha",
                                 description="NHA (test)")
    assert (converted.name, converted.description) == ("tiny-nha", "tiny converted to NHA (test)")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".lock", "checkpoints", "config.json", "generation_config.json", "hf_config.json",
        "tokenizer.json"]
    assert (tmp_path / "out" / "tokenizer.json").read_text() == ByteTokenizer().to_json()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["name"] == "tiny-nha"
