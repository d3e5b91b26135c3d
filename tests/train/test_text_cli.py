"""`hybrid-jax` on text end to end: tokenizer training, a WikiText experiment on a generated
corpus with a BPE tokenizer.json, resume, eval with bits-per-byte, logs, TensorBoard and plots."""

import json
import math
import shutil

import pytest

from experiments.cli import main
from hybrid_jax.data.tokenizer import load_tokenizer
from hybrid_jax.train.metrics import read_metrics
from tests.data.corpus_helpers import write_corpus

NAME = "lm-wikitext2-transformer-tiny"


def tiny(corpus, tokenizer, vocab=300, steps=4):
    sets = [f"data.path={corpus}/train-*.txt", f"data.eval_path={corpus}/valid.txt",
            f"data.tokenizer={tokenizer}", "data.seq_len=16", f"model.vocab_size={vocab}",
            "model.d_model=16", "model.num_heads=2", "model.layers=[\"attention\"]",
            f"train.steps={steps}",
            "train.warmup_steps=1", "train.batch_size=4", "train.log_every=1",
            "train.eval_every=2", "train.eval_batches=1", "train.checkpoint_every=2",
            "train.mesh.data=1"]
    return [arg for s in sets for arg in ("--set", s)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenizer_file(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    assert main(["tokenizer", "train", f"{corpus}/train-*.txt", "--vocab-size", "300",
                 "--out", str(out)]) == 0
    return out / "tokenizer.json"


@pytest.fixture(scope="module")
def run_dir(corpus, tokenizer_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["train", NAME, "--out", str(out), "--quiet", *tiny(corpus, tokenizer_file)]) == 0
    return out


def test_tokenizer_train_writes_a_round_tripping_bpe(corpus, tokenizer_file, capsys):
    tokenizer = load_tokenizer(tokenizer_file)
    text = (corpus / "valid.txt").read_text()
    assert tokenizer.vocab_size == 300 and tokenizer.decode(tokenizer.encode(text)) == text


def test_tokenizer_train_word_kind_takes_the_vocab_size(corpus, tmp_path, capsys):
    """`--kind word --vocab-size N` keeps the N − 2 most frequent words (it kept all)."""
    argv = ["tokenizer", "train", str(corpus / "valid.txt"), "--kind", "word"]
    assert main([*argv, "--out", str(tmp_path / "all")]) == 0
    assert main([*argv, "--vocab-size", "5", "--out", str(tmp_path / "five")]) == 0
    every = load_tokenizer(tmp_path / "all" / "tokenizer.json").vocab
    assert len(every) > 5
    assert load_tokenizer(tmp_path / "five" / "tokenizer.json").vocab == every[:5]
    assert "word tokenizer with 5 tokens" in capsys.readouterr().out


def test_tokenizer_train_reads_the_encoding_and_writes_a_json_path(tmp_path, capsys):
    """--out ending in .json is the file itself (a folder gets tokenizer.json), which is not
    replaced without --force (it was, silently); --encoding reads the text files, and
    undecodable text names it; an unknown encoding is refused before any file is read."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 na\u00efve caf\u00e9\n".encode("latin-1"))
    out = tmp_path / "words.json"
    argv = ["tokenizer", "train", str(latin), "--kind", "word", "--out", str(out)]
    assert main([*argv, "--encoding", "latin-1"]) == 0
    assert load_tokenizer(out).vocab == ["<eos>", "<unk>", "caf\u00e9", "na\u00efve"]
    assert capsys.readouterr().out == (
        f"word tokenizer with 4 tokens written to {out}; use it with --set data.tokenizer={out} "
        "--set model.vocab_size=4\n")
    assert main(argv) == 2  # an existing file is not replaced unasked
    assert capsys.readouterr().err == (f"hybrid-jax tokenizer: error: {out} already exists: "
                                       "--force replaces it, or choose another --out\n")
    assert load_tokenizer(out).vocab == ["<eos>", "<unk>", "caf\u00e9", "na\u00efve"]
    argv.append("--force")
    assert main(argv) == 2  # utf-8: the hint named data.encoding, which this command has not
    err = capsys.readouterr().err
    assert f"{latin} is not valid utf-8 text" in err and "set --encoding to its encoding" in err
    assert main([*argv, "--encoding", "klingon"]) == 2
    assert capsys.readouterr().err == ("hybrid-jax tokenizer: error: --encoding='klingon': not a "
                                       "known text encoding\n")


def test_run_records_tokenizer_metrics_and_tensorboard(run_dir, tokenizer_file):
    assert (run_dir / "tokenizer.json").read_text() == tokenizer_file.read_text()
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    evals = [r for r in records if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["eval_bits_per_byte"] > 0 and r["eval_perplexity"] > 1 for r in evals)
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and b"train/loss" in events[0].read_bytes()
    assert b"eval/bits_per_byte" in events[0].read_bytes()
    assert json.loads((run_dir / "config.json").read_text())["data"]["kind"] == "text"


def test_eval_reports_bits_per_byte_over_the_whole_file(run_dir, corpus, capsys):
    assert main(["eval", str(run_dir), "--batches", "0"]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[0])
    text = (corpus / "valid.txt").read_text()
    assert metrics["bytes"] == len(text.encode())
    nats = metrics["loss"] * metrics["tokens"]
    assert metrics["bits_per_byte"] == pytest.approx(nats / (math.log(2) * metrics["bytes"]))
    words = sum(len(line.split()) + 1 for line in text.splitlines())
    assert metrics["word_perplexity"] == pytest.approx(math.exp(nats / words))


def test_resume_extends_the_run_with_progress_lines(run_dir, corpus, tokenizer_file, tmp_path,
                                                    capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    assert main(["train", NAME, "--out", str(copy), "--resume", "--set", "train.steps=6"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "step 6/6 loss=" in out and "eta=" in out
    records = read_metrics(copy)
    assert [r["step"] for r in records if r.get("event") == "resumed"] == [4]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]

    png = tmp_path / "curves.png"
    assert main(["plot", str(run_dir), str(copy), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_resume_refuses_another_tokenizer(run_dir, tokenizer_file, tmp_path, capsys):
    """A resume trains with the run's tokenizer.json: `--set data.tokenizer=byte` was ignored,
    yet config.json then named the byte tokenizer as the run's."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = (copy / "config.json").read_text()
    argv = ["train", NAME, "--out", str(copy), "--resume", "--quiet", "--set", "train.steps=6"]
    assert main([*argv, "--set", "data.tokenizer=byte"]) == 2
    err = capsys.readouterr().err
    assert "data.tokenizer='byte': a resume keeps the run's own tokenizer" in err
    assert (copy / "config.json").read_text() == config
    # Naming the run's own file, or a copy of it, is no change.
    assert main([*argv, "--set", f"data.tokenizer={copy / 'tokenizer.json'}"]) == 0
    assert main([*argv, "--set", f"data.tokenizer={tokenizer_file}"]) == 0


def test_a_fresh_run_keeps_a_tokenizer_put_in_its_directory(corpus, tokenizer_file, tmp_path,
                                                            capsys):
    """`tokenizer train --out RUN_DIR`, then a run there that does not name that BPE: the run
    replaced it with its byte tokenizer. Naming it, or --force, trains."""
    shutil.copy(tokenizer_file, tmp_path)
    argv = ["train", NAME, "--out", str(tmp_path), "--quiet", *tiny(corpus, "byte", 257, 2)]
    assert main(argv) == 2
    assert (f"{tmp_path / 'tokenizer.json'} holds a tokenizer of 300 tokens that "
            "data.tokenizer='byte' does not name and would replace" in capsys.readouterr().err)
    assert (tmp_path / "tokenizer.json").read_text() == tokenizer_file.read_text()
    assert main([*argv, "--set", "data.tokenizer=bpe:300", "--set", "model.vocab_size=300"]) == 0
    assert (tmp_path / "tokenizer.json").read_text() == tokenizer_file.read_text()
    assert main([*argv, "--force"]) == 0
    assert load_tokenizer(tmp_path / "tokenizer.json").name == "byte"


@pytest.mark.parametrize("argv, message", [
    (["plot", "/no/run", "--out", "x.png"], "/no/run/metrics.jsonl not found"),
    (["tokenizer", "train", "/no/*.txt", "--out", "t.json"], "files='/no/*.txt' matches no file"),
    # The hints named an option the command does not have (--set files=...).
    (["tokenizer", "train", "/tmp", "--out", "t.json"],
     "files='/tmp' is a directory: give its files, e.g. /tmp/*.txt"),
    (["tokenizer", "train", "", "--out", "t.json"], "a comma-separated list, e.g. corpus/*.txt"),
])
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_tokenizer_train_refuses_a_file_as_its_folder(corpus, tmp_path, capsys):
    """`--out notes.txt` (a file, not .json): the BPE was trained, then its save failed with
    "I/O error: File exists", the training lost."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert main(["tokenizer", "train", f"{corpus}/train-*.txt", "--vocab-size", "300",
                 "--out", str(notes)]) == 2
    assert f"{notes} is a file, not a directory" in capsys.readouterr().err
    assert notes.read_text() == "mine"


def test_too_small_vocabulary_names_the_fix(corpus, tokenizer_file, tmp_path, capsys):
    """The failed start leaves the run directory as it found it: it left tokenizer.json there;
    one put there for the run (`tokenizer train --out RUN_DIR`) stays; a directory the run made
    goes (it stayed, holding its .lock)."""
    argv = ["train", NAME, "--out", str(tmp_path), "--quiet", *tiny(corpus, tokenizer_file, 257)]
    new = tmp_path / "new"
    assert main([*argv[:3], str(new), *argv[4:]]) == 2
    assert not new.exists()
    capsys.readouterr()
    assert main(argv) == 2
    assert "has 300 tokens, more than model.vocab_size=257: add --set model.vocab_size=300" in \
        capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]
    shutil.copy(tokenizer_file, tmp_path)
    assert main([*argv, "--set", "data.tokenizer=bpe:300"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "tokenizer.json"]
