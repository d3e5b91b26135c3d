"""Preemption: a run stopped by SIGTERM, or SIGKILLed at random moments while it checkpoints
every step, resumes from its last complete checkpoint and logs exactly the uninterrupted losses.

The interrupted runs are subprocesses (`tests/train/run_driver.py`, which slows each batch so
the signal lands midway); the reference and the final resumes run in this process.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from hybrid_jax.config import to_dict
from hybrid_jax.train.checkpoint import Checkpointer, saved_steps
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.preemption import StopSignals
from hybrid_jax.train.trainer import train
from tests.data.corpus_helpers import tiny_text_experiment, write_corpus

ROOT = Path(__file__).resolve().parents[2]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


@pytest.fixture
def start():
    """`start(experiment, run_dir, delay)` runs `run_driver` in a process of its own; each is
    killed at teardown, so a failed assertion leaves no training run behind."""
    started = []

    def start_run(experiment, run_dir: Path, delay: float) -> subprocess.Popen:
        config = run_dir.parent / f"{run_dir.name}.json"
        config.write_text(json.dumps(to_dict(experiment)))
        started.append(subprocess.Popen(
            [sys.executable, "-m", "tests.train.run_driver", str(config), str(run_dir),
             str(delay)], cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE))
        return started[-1]

    yield start_run
    for process in started:
        process.kill()
        process.wait()


def wait_for(condition, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run exited ({process.returncode}) too early: "
                                 f"{process.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the run made no progress")
        time.sleep(0.02)


def records(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []


def resumed_at(run_dir: Path) -> list[int]:
    """The steps that each resume of the run started from."""
    return [r["step"] for r in records(run_dir) if r.get("event") == "resumed"]


STEPS = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted run (checkpoint frequency does not change the losses)."""
    run = tmp_path_factory.mktemp("reference")
    return run, train(tiny_text_experiment(corpus, steps=STEPS), run, progress=False)


def test_sigterm_then_resume_gives_the_uninterrupted_losses(corpus, reference, tmp_path,
                                                            start):
    experiment = tiny_text_experiment(corpus, steps=STEPS, checkpoint_every=100)
    reference_dir, reference = reference
    run = tmp_path / "run"
    process = start(experiment, run, delay=0.15)
    wait_for(lambda: any(r.get("step", 0) >= 5 and "loss" in r for r in records(run)), process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM, process.stderr.read().decode()
    event = [r for r in records(run) if r.get("event") == "interrupted"]
    assert event and event[0]["signal"] == "SIGTERM" and 5 <= event[0]["step"] < STEPS
    assert Checkpointer(run).latest_step() == event[0]["step"]  # saved on the way out

    resumed = train(experiment, run, progress=False, resume=True)
    assert losses(run) == losses(reference_dir)  # every step, bit for bit
    assert len(losses(run)) == STEPS
    for key in ("train_loss", "eval_loss", "eval_bits_per_byte"):
        assert resumed[key] == reference[key]


def test_time_limit_stops_checkpoints_and_resumes(corpus, reference, tmp_path):
    """A spent `train.time_limit_s` ends the loop at the first step boundary (here before step
    1): checkpoint, final eval, `time_limit_reached`; resuming under a limit it does not reach
    gives the uninterrupted losses."""
    experiment = tiny_text_experiment(corpus, steps=STEPS, time_limit_s=1e-9)
    limited = train(experiment, tmp_path, progress=False)
    assert limited["time_limit_reached"] and limited["steps"] == 0
    assert np.isfinite(limited["eval_loss"]) and saved_steps(tmp_path) == [0]
    assert [r for r in records(tmp_path) if "event" in r] == [
        {"step": 0, "event": "time_limit", "seconds": 1e-9}]
    unspent = tiny_text_experiment(corpus, steps=STEPS, time_limit_s=3600.0)
    resumed = train(unspent, tmp_path, progress=False, resume=True)
    assert losses(tmp_path) == losses(reference[0]) and not resumed["time_limit_reached"]


def test_sigkill_during_saves_resumes_from_the_last_complete_checkpoint(corpus, reference,
                                                                        tmp_path, start):
    experiment = tiny_text_experiment(corpus, steps=STEPS, checkpoint_every=1,
                                      keep_checkpoints=2)
    run, rng, expected_start = tmp_path / "run", np.random.default_rng(0), None
    for _ in range(3):
        seen = len(resumed_at(run))
        process = start(experiment, run, delay=0.1)
        if expected_start is not None:  # it must announce the checkpoint we expect
            wait_for(lambda seen=seen: len(resumed_at(run)) > seen, process)
            assert resumed_at(run)[-1] == expected_start
        # Kill at a random moment once training is under way (most of the time is spent saving).
        wait_for(lambda: (run / "checkpoints").is_dir() and
                 any(p.name.isdigit() for p in (run / "checkpoints").iterdir()), process)
        time.sleep(rng.uniform(0.0, 0.4))
        process.kill()
        process.wait()
        step_dirs = set(saved_steps(run))
        checkpointer = Checkpointer(run)  # (removes the temporary directory of a torn save)
        expected_start = checkpointer.latest_step()
        assert set(checkpointer.manager.all_steps()) == step_dirs  # no torn step directory
        checkpointer.close()
        assert expected_start is not None and expected_start < STEPS
    result = train(experiment, run, progress=False, resume=True)
    assert resumed_at(run)[-1] == expected_start
    assert losses(run) == losses(reference[0]) and result["steps"] == STEPS


def test_stop_signals_are_caught_then_restored():
    previous = signal.getsignal(signal.SIGINT)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert stop.received == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is previous


@pytest.mark.parametrize("received, codes, expected", [
    (None, [0, 0, 0], None),  # nobody: run on
    (None, [0, signal.SIGTERM, signal.SIGINT], "SIGTERM"),  # the first process's signal
    ("SIGINT", [signal.SIGINT, signal.SIGTERM, 0], "SIGINT"),  # its own signal stays
])
def test_every_process_stops_when_any_received_a_signal(monkeypatch, received, codes, expected):
    """`everywhere()` in a 3-process job (the all-gather stubbed with what each process
    received): one signal anywhere stops them all, naming the first process's signal."""
    from jax.experimental import multihost_utils

    monkeypatch.setattr(jax, "process_count", lambda: 3)
    monkeypatch.setattr(multihost_utils, "process_allgather",
                        lambda x: np.asarray([int(c) for c in codes], np.int32))
    stop = StopSignals()  # not entered: no handlers, only the flag
    stop.received = received
    assert stop.everywhere() is (expected is not None)
    assert stop.received == expected
