"""Bad inputs and faults around a trained run, through the CLI (`main()` in-process) and the
Python API: damaged checkpoints, swapped tokenizers, run-directory clashes, bad eval/generate
arguments, text files that are not text. Each ends in a one-line error naming the culprit, or
in the correct behaviour (a resume that falls back past a damaged checkpoint)."""

import errno
import gzip
import json
import logging
import shutil
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.run import read_experiment
from hybrid_jax.config import MeshConfig
from hybrid_jax.data.tokenizer import WordTokenizer
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.metrics import MetricsLog, read_metrics
from hybrid_jax.train.run_dir import RunDirError, RunLock, prepare_run_dir, recorded_experiment
from hybrid_jax.train.trainer import (
    changed_data_settings,
    evaluate,
    nonfinite_message,
    restore_train_state,
    train,
)
from tests.data.corpus_helpers import tiny_text_experiment, write_corpus
from tests.train.damage import flip_byte, largest_array_file, truncate
from tests.train.test_text_cli import tiny as text_cli_run

NAME = "lm-wikitext2-transformer-tiny"


def tiny(corpus: Path, steps: int = 4) -> list[str]:
    """A width-16 one-layer byte-level run, checkpoints every 2 steps."""
    return text_cli_run(corpus, "byte", vocab=257, steps=steps)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["train", NAME, "--out", str(out), "--quiet", *tiny(corpus)]) == 0
    return out


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run (checkpoints at steps 2 and 4) to damage."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --- checkpoints -------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, problem", [
    (flip_byte, "changed since it was saved"),
    (truncate, "truncated"),
    (Path.unlink, "is missing"),
])
def test_damaged_checkpoint_is_refused_by_eval(run, capsys, damage, problem):
    victim = largest_array_file(run / "checkpoints" / "4")
    damage(victim)
    err = one_line_error(capsys, ["eval", str(run)])
    name = victim.relative_to(run.absolute() / "checkpoints" / "4")
    assert f"checkpoints/4 is damaged: {name} " in err and problem in err


def test_damaged_checkpoint_is_refused_by_generate(run, capsys):
    flip_byte(largest_array_file(run / "checkpoints" / "4"))
    err = one_line_error(capsys, ["generate", str(run), "--prompt-ids", "1 2"])
    assert "checkpoints/4 is damaged" in err


def test_resume_falls_back_past_a_damaged_checkpoint(run, corpus, capsys):
    truncate(largest_array_file(run / "checkpoints" / "4"))
    assert main(["train", NAME, "--out", str(run), "--resume", *tiny(corpus, steps=6)]) == 0
    out = capsys.readouterr().out
    assert "checkpoints/4 is damaged" in out and "damaged_checkpoints/4" in out
    assert "resumed from" in out and out.index("damaged") < out.index("resumed from")
    assert "no intact checkpoint left" not in out  # it resumed from step 2
    assert (run / "damaged_checkpoints" / "4").is_dir()
    events = [r for r in read_metrics(run) if "event" in r]
    assert [(e["event"], e["step"]) for e in events] == [("damaged_checkpoint", 4),
                                                         ("resumed", 2)]
    # steps 3 and 4 of the first run are logged again: their first records are dropped
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == [2, 4, 6]


def test_resume_with_other_data_settings_says_the_position_moved(run, corpus, capsys):
    """The data position is a count of global batches: after a change of data.* or the
    batch size it reads other examples. The resume says which settings changed (it was
    silent); a resume without a change says nothing."""
    def resume(steps: int) -> str:
        assert main(["train", NAME, "--out", str(run), "--resume", *tiny(corpus, steps=steps),
                     "--set", "data.seq_len=8", "--set", "train.batch_size=2"]) == 0
        return capsys.readouterr().out

    assert ("note: data.seq_len, train.batch_size changed since the checkpoint; its data "
            "position counts batches of the old settings") in resume(6)
    assert [(r["step"], r["settings"]) for r in read_metrics(run)
            if r.get("event") == "data_changed"] == [(4, ["data.seq_len", "train.batch_size"])]
    assert "note:" not in resume(8)


def test_changed_data_settings_reads_an_older_config_with_its_defaults(trained):
    experiment = read_experiment(trained / "config.json")
    saved = json.loads((trained / "config.json").read_text())
    del saved["data"]["encoding"]  # as a config written before the field existed
    assert changed_data_settings(saved, experiment) == []
    saved["train"]["seed"] = 7
    saved["data"]["eval_path"] = "other.txt"
    assert changed_data_settings(saved, experiment) == ["data.eval_path", "train.seed"]
    assert changed_data_settings(None, experiment) == []


def test_resume_moves_every_damaged_checkpoint_then_starts_over(run, corpus, capsys):
    """Each goes to damaged_checkpoints/STEP; a step damaged once before keeps its first copy
    (it was deleted) and this one goes to STEP.1."""
    for step in (2, 4):
        flip_byte(largest_array_file(run / "checkpoints" / str(step)))
    earlier = run / "damaged_checkpoints" / "2"
    earlier.mkdir(parents=True)
    (earlier / "from-an-earlier-resume").touch()
    assert main(["train", NAME, "--out", str(run), "--resume", *tiny(corpus, steps=6)]) == 0
    out = capsys.readouterr().out
    assert "no intact checkpoint left: starting from step 0" in out
    assert sorted(p.name for p in (run / "damaged_checkpoints").iterdir()) == ["2", "2.1", "4"]
    assert (earlier / "from-an-earlier-resume").is_file()
    assert (run / "damaged_checkpoints" / "2.1" / "checksums.json").is_file()
    events = [(e["event"], e["step"]) for e in read_metrics(run) if "event" in e]
    assert events == [("damaged_checkpoint", 4), ("damaged_checkpoint", 2)]
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == [2, 4, 6]


def test_eval_names_its_checkpoint_step(trained, capsys):
    assert main(["eval", str(trained), "--step", "2"]) == 0
    captured = capsys.readouterr()
    assert f"eval: checkpoint step 2 of {trained}" in captured.err
    assert json.loads(captured.out.splitlines()[0])["step"] == 2


@pytest.mark.parametrize("argv, message", [
    (["eval", "{run}", "--step", "3"], "checkpoints/3 not found; available steps: [2, 4]"),
    (["eval", "{run}", "--step", "-1"], "--step=-1: expected a finite value >= 0"),
    (["eval", "{run}", "--batches", "-1"], "--batches=-1: expected a finite value >= 0"),
    (["generate", "{run}", "--prompt-ids", "1 999"],
     "prompt token id 999 at index [0, 1] is outside the vocabulary [0, 257)"),
    (["generate", "{run}", "--prompt-ids", "5,-3"],
     "prompt token id -3 at index [0, 1] is outside the vocabulary"),
    (["generate", "{run}", "--prompt-ids", "1 two"], "--prompt-ids must be integers"),
    (["generate", "{run}", "--prompt-ids", "1", "--stop", "."],
     "--stop only applies with text prompts (--prompt / --prompt-file), not --prompt-ids"),
    (["generate", "{run}", "--prompt-ids", " "], "--prompt-ids is empty"),
    (["generate", "{run}", "--prompt-ids", "1", "--temperature", "-0.5"],
     "--temperature=-0.5: expected a finite value >= 0"),
    (["generate", "{run}", "--prompt-ids", "1", "--temperature", "nan"], "--temperature=nan"),
    (["generate", "{run}", "--prompt-ids", "1", "--top-k", "0"], "--top-k=0: expected"),
    (["generate", "{run}", "--prompt-ids", "1", "--top-k", "1000"],
     "--top-k=1000: expected at most the vocabulary size 257"),
    # Greedy decoding (the default temperature 0) ignored them without a word.
    (["generate", "{run}", "--prompt-ids", "1", "--top-k", "5", "--top-p", "0.9"],
     "--top-k and --top-p only apply when sampling: add --temperature T > 0"),
    (["generate", "{run}", "--prompt-ids", "1", "--max-new-tokens", "0"],
     "--max-new-tokens=0: expected a finite value >= 1"),
    (["eval", "{run}", "--set", "train.batch_size=-2"], "TrainConfig.batch_size=-2"),
    # Settings eval never reads were ignored (a schedule: eval takes --modes), or, shaping the
    # optimizer state, failed the checkpoint's load naming 120 optimizer arrays.
    (["eval", "{run}", "--set", "train.mode_schedule.pattern=linear", "--set", "train.steps=9"],
     "--set train.mode_schedule.pattern, train.steps: eval would ignore them; it reads model, "
     "data, train.batch_size, train.seed, train.mesh, train.eval_batches"),
    (["eval", "{run}", "--set", "train.grad_clip=none"], "--set train.grad_clip: eval would"),
    (["eval", "{run}", "--batches", "1", "--set", "train.eval_batches=2"],
     "--set train.eval_batches: eval would ignore it"),  # --batches wins
    (["eval", "{run}", "--set", "data.tokenizer=byte"],  # the run's tokenizer.json holds
     "--set data.tokenizer: eval would ignore it; it reads model, data, train.batch_size, "
     "train.seed, train.mesh, train.eval_batches (and what is under them), not data.tokenizer"),
    (["generate", "{run}", "--prompt-ids", "1", "--set", "data.tokenizer=other.json"],
     "--set data.tokenizer: generate would ignore it; it reads model, train.mesh"),
    (["eval", "{run}", "--set", "model.d_model=32"], "does not match the experiment config"),
    # Batch 4 on 8 data devices: JAX's error named a NamedSharding's tiling, not the setting.
    (["eval", "{run}", "--set", "train.mesh.data=8"],
     "train.batch_size=4 does not split over the mesh's batch axes (data 8 x fsdp 1 = 8 "
     "shards): use a multiple of 8"),
    # Time over 3 seq devices: the context-parallel ops' error named an activation's shape.
    (["eval", "{run}", "--set", "train.mesh.data=1", "--set", "train.mesh.seq=3"],
     "data.seq_len=16 does not split over the mesh's 3 'seq' devices"),
])
def test_bad_eval_and_generate_arguments(trained, capsys, argv, message):
    err = one_line_error(capsys, [a.format(run=trained) for a in argv])
    assert message in err


def test_eval_lays_out_a_run_by_its_axis_rules(trained, capsys):
    """The run's batch rule holds in eval as in training: with `batch=data` and the 8 devices
    on fsdp, eval split the batch of 4 by the default table (data x fsdp = 8) and refused it."""
    assert main(["eval", str(trained), "--set", "train.mesh.data=1", "--set",
                 "train.mesh.fsdp=8", "--set", 'train.mesh.axis_rule_overrides=["batch=data"]'
                 ]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["tokens"] > 0


@pytest.mark.parametrize("command", [["eval"], ["generate", "--prompt-ids", "1"]])
def test_a_run_without_checkpoints_is_named_and_left_as_it_was(trained, tmp_path, capsys,
                                                               command):
    """The load made an empty checkpoints/ there (orbax's manager creates its directory)."""
    shutil.copy(trained / "config.json", tmp_path)
    err = one_line_error(capsys, [command[0], str(tmp_path), *command[1:]])
    assert (f"no checkpoint found in {tmp_path}: it holds its config.json, but "
            f"{tmp_path / 'checkpoints'} does not exist; no training is running there") in err
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_config_json_damaged(run, capsys):
    (run / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in one_line_error(capsys, ["eval", str(run)])


# --- tokenizer ---------------------------------------------------------------------------------

def test_swapped_tokenizer_is_refused(run, capsys):
    WordTokenizer(["<eos>", "<unk>", "a"]).save(run / "tokenizer.json")
    err = one_line_error(capsys, ["eval", str(run)])
    assert "tokenizer.json is not the tokenizer checkpoint step 4 was trained with" in err


def test_swapped_tokenizer_is_refused_on_resume(run, corpus, capsys):
    WordTokenizer(["<eos>", "<unk>", "a"]).save(run / "tokenizer.json")
    err = one_line_error(capsys, ["train", NAME, "--out", str(run), "--resume",
                                  *tiny(corpus, steps=6)])
    assert "is not the tokenizer checkpoint step 4 was trained with" in err


@pytest.mark.parametrize("out", ["{run}", "{run}/tokenizer.json"])
def test_tokenizer_train_keeps_off_a_trained_run(run, corpus, capsys, out):
    """Its checkpoints were made with the tokenizer.json there: a new one overwrote it."""
    before = (run / "tokenizer.json").read_bytes()
    err = one_line_error(capsys, ["tokenizer", "train", str(corpus / "valid.txt"), "--out",
                                  out.format(run=run), "--vocab-size", "260"])
    assert f"{run} holds a run (" in err and "its tokenizer.json belongs to that run" in err
    assert (run / "tokenizer.json").read_bytes() == before


def test_missing_tokenizer_is_named(run, capsys):
    (run / "tokenizer.json").unlink()
    err = one_line_error(capsys, ["eval", str(run)])
    assert "tokenizer.json not found: checkpoint step 4 was trained with a tokenizer" in err


@pytest.mark.parametrize("content, message", [
    ("{oops", "is not valid JSON"),
    ('{"hybrid_jax_tokenizer": "morse"}', "unknown hybrid_jax_tokenizer 'morse'"),
])
def test_bad_tokenizer_file(corpus, tmp_path, capsys, content, message):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(content)
    err = one_line_error(capsys, ["train", NAME, "--out", str(tmp_path / "r"), *tiny(corpus),
                                  "--set", f"data.tokenizer={bad}"])
    assert f"tokenizer file {bad}" in err and message in err


# --- run directory -----------------------------------------------------------------------------

def test_a_second_writer_is_refused_naming_the_holder(run, corpus, capsys):
    with RunLock(run):
        err = one_line_error(capsys, ["train", NAME, "--out", str(run), "--resume",
                                      *tiny(corpus, steps=6)])
    import os

    assert f"{run} is in use by another run (process {os.getpid()}, training, lock" in err


def test_another_experiments_directory_needs_force(run, corpus, capsys):
    err = one_line_error(capsys, ["train", NAME, "--out", str(run), *tiny(corpus)])
    assert f"{run} already holds a run of '{NAME}' (config.json, metrics.jsonl" in err
    assert "--force to overwrite it" in err
    other = ["train", "mqar-transformer-tiny", "--out", str(run), "--resume"]
    err = one_line_error(capsys, other)
    assert f"holds a run of '{NAME}', not 'mqar-transformer-tiny'" in err


def test_force_starts_afresh(run, corpus, capsys):
    assert main(["train", NAME, "--out", str(run), "--force", "--quiet",
                 *tiny(corpus, steps=2)]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2]


def test_prepare_run_dir_decides_resume_and_what_force_removes(tmp_path):
    """Each case of `prepare_run_dir` (the CLI tests above only reach the refusals): an empty
    directory resumes (nothing to resume from, nothing to refuse); a resume in another
    experiment's directory with --force starts afresh there; starting afresh removes every
    run output, damaged checkpoints included, and keeps a tokenizer put there for the run."""
    run = tmp_path / "run"
    run.mkdir()
    assert prepare_run_dir(run, NAME, resume=True, force=False) is True
    assert prepare_run_dir(run, NAME, resume=False, force=False) is False
    (run / "config.json").write_text(json.dumps({"name": "other"}))
    (run / "damaged_checkpoints" / "4").mkdir(parents=True)
    (run / "tokenizer.json").write_text("{}")
    assert prepare_run_dir(run, "other", resume=True, force=False) is True
    with pytest.raises(RunDirError, match=f"holds a run of 'other', not '{NAME}'"):
        prepare_run_dir(run, NAME, resume=True, force=False)
    assert prepare_run_dir(run, NAME, resume=True, force=True) is False
    assert sorted(p.name for p in run.iterdir()) == ["tokenizer.json"]
    (run / "damaged_checkpoints").mkdir()  # all that is left of an earlier run
    with pytest.raises(RunDirError, match=r"already holds run outputs \(damaged_checkpoints\)"):
        prepare_run_dir(run, NAME, resume=False, force=False)


@pytest.mark.parametrize("resume", [True, False])
def test_a_killed_writers_temporary_files_go_at_the_next_start(tmp_path, caplog, resume):
    """A run killed inside an atomic write (SIGKILL, the OOM killer) leaves `NAME.RANDOM.tmp`
    beside metrics.jsonl / results.json / config.json; the next start, holding the lock,
    removes those and says so, and keeps every other file (a tokenizer's temporary included:
    `hybrid-jax tokenizer train --out` writes it without the run lock)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"name": NAME}))
    left = ["metrics.jsonl.0a1b2c3d4e5f.tmp", "results.json.tmp", "config.json.ffeeddccbbaa.tmp"]
    kept = ["config.json", "tokenizer.json.0a1b2c3d4e5f.tmp", "notes.tmp", "metrics.jsonl.bak"]
    for name in left + kept[1:]:
        (run / name).write_text("torn")
    with caplog.at_level(logging.INFO, logger="hybrid_jax.train.run_dir"):
        prepare_run_dir(run, NAME, resume=resume, force=True)
    remaining = sorted(p.name for p in run.iterdir())
    assert remaining == sorted(kept[1:] if not resume else kept)
    assert [r.getMessage() for r in caplog.records] == [
        f"removed {run / name}: a temporary file of a write that was killed before it finished"
        for name in sorted(left)]


@pytest.mark.parametrize("content, expected", [
    (None, None), ('{"name": "a"}', "a"), ("{}", "?"), ("[1, 2]", "?"), ('{"name": ', "?")])
def test_recorded_experiment_of_any_config_json(tmp_path, content, expected):
    """The experiment a directory holds: None without config.json, '?' for one that is not an
    object naming it (a list, a torn file) rather than an exception."""
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    assert recorded_experiment(tmp_path) == expected


def test_rollback_and_resume_events_all_stay_in_the_metrics(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for step in range(1, 7):
        log.write({"step": step, "loss": 1.0})
        if step in (3, 5):
            log.write({"step": step, "event": "rollback", "to_step": 2})
    log.truncate(2)
    kept = read_metrics(tmp_path)
    assert [r["step"] for r in kept if "loss" in r] == [1, 2]
    assert [r["step"] for r in kept if r.get("event") == "rollback"] == [3, 5]


def test_truncate_without_a_file_and_a_torn_line_midway(tmp_path):
    """`truncate` drops the records after the step from the history of a log that writes no
    file, too (events stay); a torn line midway (a run killed mid-write, then resumed, appends
    after it) is skipped and the records after it are read."""
    log = MetricsLog(None)
    for step in range(1, 5):
        log.write({"step": step, "loss": 1.0})
    log.write({"step": 4, "event": "interrupted"})
    log.truncate(2)
    assert [(r["step"], "event" in r) for r in log.history] == [(1, False), (2, False),
                                                                 (4, True)]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 3}]
    # Lines that are JSON but no record (damage): `plot` failed on one as an unexpected
    # TypeError ("argument of type 'int' is not iterable"), or a KeyError without a step.
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n5\n{"loss": 2.0}\n[3]\n{"step": 3}\n')
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 3}]


def test_nonfinite_message_says_loss_or_gradient():
    assert nonfinite_message(7, float("nan"), 1.0).startswith("non-finite loss nan at step 7")
    gradient = nonfinite_message(7, 5.549, float("inf"))
    assert gradient.startswith("non-finite gradient (norm inf) at step 7")
    assert "the loss 5.549 is finite" in gradient


def test_disk_full_is_one_line(corpus, tmp_path, capsys, monkeypatch):
    def full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))

    monkeypatch.setattr(MetricsLog, "write", full)
    err = one_line_error(capsys, ["train", NAME, "--out", str(tmp_path / "r"), *tiny(corpus)])
    assert "I/O error (disk full): No space left on device: " in err and "metrics.jsonl" in err


def test_unexpected_errors_are_one_line_unless_debugging(corpus, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("hybrid_jax.train.trainer.init_train_state", broken)
    argv = ["train", NAME, "--out", str(tmp_path / "r"), *tiny(corpus)]
    err = one_line_error(capsys, argv)
    assert "unexpected RuntimeError: boom (set HYBRID_JAX_DEBUG=1 for the traceback)" in err
    monkeypatch.setenv("HYBRID_JAX_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(argv + ["--force"])


# --- text data ---------------------------------------------------------------------------------

def text_run(corpus: Path, tmp_path: Path, train_file: Path, *extra: str) -> list[str]:
    return ["train", NAME, "--out", str(tmp_path / "r"), "--quiet", *tiny(corpus, steps=2),
            "--set", f"data.path={train_file}", *extra]


def test_text_in_another_encoding_is_named_and_readable_with_data_encoding(corpus, tmp_path,
                                                                           capsys):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(("caf\u00e9 na\u00efve\n" * 200).encode("latin-1"))
    err = one_line_error(capsys, text_run(corpus, tmp_path, latin))
    assert f"data file {latin} is not valid utf-8 text (near line 1" in err
    assert "set data.encoding" in err
    assert main(text_run(corpus, tmp_path, latin, "--set", "data.encoding=latin-1")) == 0


def test_binary_file_is_named(corpus, tmp_path, capsys):
    binary = tmp_path / "weights.txt"
    binary.write_bytes(b"header\n" + bytes(range(256)) * 8)
    err = one_line_error(capsys, text_run(corpus, tmp_path, binary))
    assert f"data file {binary}" in err


def test_nul_bytes_are_named(corpus, tmp_path, capsys):
    binary = tmp_path / "nul.txt"
    binary.write_bytes(b"line one\nline\x00two\n")
    err = one_line_error(capsys, text_run(corpus, tmp_path, binary))
    assert f"data file {binary} looks binary (a NUL byte on line 2)" in err


def test_damaged_gzip_is_named(corpus, tmp_path, capsys):
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(b"some text\n" * 1000)[:-30])
    err = one_line_error(capsys, text_run(corpus, tmp_path, packed))
    assert f"data file {packed} is a damaged .gz stream" in err


def test_token_ids_beyond_the_vocabulary_in_a_token_file(corpus, tmp_path, capsys):
    import numpy as np

    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.array([1, 2, 300], np.uint16))
    err = one_line_error(capsys, text_run(corpus, tmp_path, tokens))
    assert f"token file {tokens} holds id 300, outside the vocabulary of 257" in err


def test_restore_api_names_a_bad_step(trained):
    experiment = read_experiment(trained / "config.json")
    with pytest.raises(FileNotFoundError, match=r"checkpoints/99 not found; available steps: "
                                                r"\[2, 4\]"):
        restore_train_state(experiment, trained, make_mesh(MeshConfig(data=1)), step=99)


def test_evaluate_api_names_a_batch_the_mesh_cannot_split(trained):
    import numpy as np

    experiment = read_experiment(trained / "config.json")
    ts, _ = restore_train_state(experiment, trained, make_mesh(MeshConfig(data=8)))
    batch = {k: np.zeros((4, 16), np.int32) for k in ("inputs", "targets", "mask")}
    with pytest.raises(ValueError, match=r"train.batch_size=4 does not split over the mesh's "
                                         r"batch axes \(data 8 x fsdp 1 = 8 shards\)"):
        evaluate(ts, [batch])


def test_evaluate_counts_a_global_batch_once_in_a_multiprocess_job(trained, monkeypatch):
    """Held-out batches are global (every process places its own rows of them): 4 rows on 8
    data devices were let through as 4 x 2 processes = 8 rows, to fail in JAX's placement."""
    import jax
    import numpy as np

    experiment = read_experiment(trained / "config.json")
    ts, _ = restore_train_state(experiment, trained, make_mesh(MeshConfig(data=8)))
    batch = {k: np.zeros((4, 16), np.int32) for k in ("inputs", "targets", "mask")}
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"train.batch_size=4 does not split over the mesh's "
                                         r"batch axes \(data 8 x fsdp 1 = 8 shards\)"):
        evaluate(ts, [batch])


def test_train_api_refuses_a_locked_directory(trained, tmp_path):
    experiment = tiny_text_experiment(trained.parent)
    with RunLock(tmp_path), pytest.raises(ValueError, match="is in use by another run"):
        train(experiment, tmp_path, progress=False)


def test_a_failing_background_thread_is_one_line(capsys, monkeypatch):
    import threading

    import experiments.cli as cli

    def writer_fails(args):
        def write():
            raise OSError(errno.ENOSPC, "No space left on device", "events.out")

        thread = threading.Thread(target=write, name="tensorboard-writer")
        thread.start()
        thread.join()
        return 0

    monkeypatch.setitem(cli.COMMANDS, "list", writer_fails)
    assert main(["list"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == ("hybrid-jax list: error in thread tensorboard-writer: I/O error (disk full): "
                   "No space left on device: events.out")


def test_a_missing_shared_corpus_says_how_to_point_at_one(tmp_path, capsys):
    """An lm-* experiment whose corpus is not in the shared data folder: the error named the
    file only; it now names the folder and HYBRID_JAX_DATA / data.path."""
    from experiments.configs.lm import DATA

    missing = f"{DATA}/no-such-corpus/train.raw"
    assert main(["train", NAME, "--out", str(tmp_path / "r"), "--quiet",
                 "--set", f"data.path={missing}"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"data file {missing} not found" in err and len(err.splitlines()) == 1
    assert "set HYBRID_JAX_DATA=DIR for a folder of that layout, or --set data.path=..." in err
    # a file of the user's own stays a plain one-line error
    assert main(["train", NAME, "--out", str(tmp_path / "s"), "--quiet",
                 "--set", f"data.path={tmp_path}/mine.txt"]) == 2
    assert "HYBRID_JAX_DATA" not in capsys.readouterr().err


def test_a_file_given_as_the_run_directory_is_named(tmp_path, capsys):
    """`--out` naming a file said only "I/O error: File exists"."""
    path = tmp_path / "afile"
    path.write_text("x")
    with pytest.raises(RunDirError, match=f"^{path} is a file, not a run directory: choose "
                                          "another --out$"):
        RunLock(path).acquire()
    assert main(["train", "mqar-transformer-tiny", "--out", str(path), "--quiet"]) == 2
    assert "is a file, not a run directory" in capsys.readouterr().err
    assert path.read_text() == "x"
