"""`hybrid-jax import hf / generate --prompt / export hf / convert` end to end, and their
one-line errors."""

import json

import pytest

from experiments.cli import main
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


def test_export_and_convert(run_dir, tmp_path, capsys):
    assert main(["export", "hf", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert main(["convert", str(run_dir), "--to", "nha", "--out", str(tmp_path / "nha"),
                 "--window", "full", "--slots", "4", "--scan-layers"]) == 0
    assert (tmp_path / "nha" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "nha" / "config.json").read_text())["model"]["scan_layers"]
    assert main(["convert", str(run_dir), "--to", "oryx", "--out", str(tmp_path / "oryx")]) == 0
    assert main(["generate", str(tmp_path / "oryx"), "--prompt-ids", "3 4 5",
                 "--max-new-tokens", "4", "--speculative", "2"]) == 0
    assert "acceptance rate" in capsys.readouterr().err


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
