"""Signals stop a run within seconds even when a step never finishes (the watchdog), and the
logs written so far are on disk with a message saying what was saved."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import hybrid_jax as hj
from hybrid_jax.config import to_dict
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.trainer import _Run
from tests.data.corpus_helpers import tiny_text_experiment, write_corpus
from tests.reliability.stuck_driver import STUCK_STEP

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def start_stuck_run(corpus: Path, run: Path, grace: float) -> subprocess.Popen:
    experiment = tiny_text_experiment(corpus, steps=50, checkpoint_every=2, stop_grace_s=grace)
    config = run.parent / "config.json"
    config.write_text(json.dumps(to_dict(experiment)))
    return subprocess.Popen([sys.executable, "-m", "tests.reliability.stuck_driver",
                             str(config), str(run)], cwd=ROOT, env=os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_until_stuck(run: Path, process: subprocess.Popen) -> None:
    """Until the step before the stuck one is logged (the next flush then blocks)."""
    deadline = time.monotonic() + 240
    while not ((run / "metrics.jsonl").is_file() and any(
            r.get("step") == STUCK_STEP - 1 and "loss" in r for r in read_metrics(run))):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the stuck step"
        time.sleep(0.05)
    time.sleep(1.0)  # the main thread is now waiting on the stuck step's metrics


@pytest.mark.parametrize("signals, grace", [
    ((signal.SIGTERM,), 2.0),  # no second signal: the watchdog's timeout ends the run
    ((signal.SIGINT, signal.SIGINT), 600.0),  # a second signal ends it at once
])
def test_a_stuck_run_exits_within_seconds(corpus, tmp_path, signals, grace):
    run = tmp_path / "run"
    process = start_stuck_run(corpus, run, grace)
    try:  # killed whatever fails: a run that never got stuck must not outlive the test
        wait_until_stuck(run, process)
        sent = time.monotonic()
        for sig in signals:
            process.send_signal(sig)
            time.sleep(0.3)
        code = process.wait(timeout=30)
    finally:
        process.kill()
    elapsed = time.monotonic() - sent
    err = process.stderr.read().decode()
    assert code == 128 + signals[-1], err[-3000:]
    assert elapsed < grace + 10 if len(signals) == 1 else elapsed < 10
    why = "did not stop within 2 s of SIGTERM" if len(signals) == 1 else "second signal (SIGINT)"
    assert why in err, err[-3000:]
    assert f"the last complete checkpoint is step 2 ({run.absolute()}/checkpoints/2)" in err
    assert "metrics.jsonl and tensorboard/ are flushed" in err
    logged = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert logged == list(range(1, STUCK_STEP))
    assert list((run / "tensorboard").iterdir())  # event file written, not lost in a buffer


def test_force_exit_message_says_what_is_on_disk(tmp_path):
    """The three answers of the watchdog's message: no run directory, a run directory without
    checkpoints, and the last complete checkpoint (a torn save's temporary name is not one)."""
    class Log:
        flushed = 0

        def flush(self):
            self.flushed += 1

    checkpointer = SimpleNamespace(directory=tmp_path / "checkpoints")
    run = SimpleNamespace(log=Log(), out=None, checkpointer=checkpointer)
    assert _Run.on_force_exit(run, "SIGTERM") == "Nothing was saved (no run directory)."
    run.out = tmp_path
    flushed = f"{tmp_path / 'metrics.jsonl'} and tensorboard/ are flushed; "
    assert _Run.on_force_exit(run, "SIGTERM") == flushed + "no checkpoint was saved."
    for name in ("2", "4", "6.orbax-checkpoint-tmp-1"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert _Run.on_force_exit(run, "SIGTERM") == (
        flushed + f"the last complete checkpoint is step 4 ({tmp_path}/checkpoints/4); "
        "resume with --resume.")
    assert run.log.flushed == 3


@pytest.mark.parametrize("step", [3, 10])
def test_a_loop_that_stops_on_a_signal_acknowledges_it(step):
    """Once the loop sees the signal (midway, or on the last step) it acknowledges the stop:
    the checkpoint saved next may take longer than `stop_grace_s` without a forced exit."""
    class Stop:
        received, acknowledged = "SIGTERM", 0

        def everywhere(self):
            return True

        def acknowledge(self):
            self.acknowledged += 1

    stop = Stop()
    run = SimpleNamespace(cfg=SimpleNamespace(steps=10, time_limit_s=0.0), step=step,
                          out_of_time=lambda deadline: False)
    _Run.loop(run, stop)
    assert stop.acknowledged == 1


# Enters StopSignals(grace_s=0.2), signals itself, acknowledges the stop when asked, then stays
# "busy" five grace periods before leaving the context and printing what it received.
ACKNOWLEDGING = """
import os, signal, sys, time
from hybrid_jax.train.preemption import StopSignals
with StopSignals(grace_s=0.2) as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    while stop.received is None:
        time.sleep(0.01)
    if sys.argv[1] == "acknowledge":
        stop.acknowledge()
    time.sleep(1.0)
print(stop.received)
"""


@pytest.mark.parametrize("acknowledge", [True, False])
def test_an_acknowledged_stop_is_not_forced_after_the_grace_period(acknowledge):
    """A loop that acknowledges the stop (it is checkpointing) may take longer than `grace_s`
    and leaves normally; without the acknowledgement the watchdog ends the process with
    128 + SIGTERM once `grace_s` has passed. (The stuck-run test above never acknowledges,
    so it cannot tell an acknowledgement that works from one that is ignored.)"""
    process = subprocess.run(
        [sys.executable, "-c", ACKNOWLEDGING, "acknowledge" if acknowledge else "no"], cwd=ROOT,
        env=os.environ.copy(), capture_output=True, text=True, timeout=60)
    if acknowledge:
        assert (process.returncode, process.stdout) == (0, "SIGTERM\n"), process.stderr[-3000:]
    else:
        assert process.returncode == 128 + signal.SIGTERM, process.stderr[-3000:]
        assert "did not stop within 0.2 s of SIGTERM" in process.stderr


def test_a_signal_during_the_final_evaluation_is_raised_again_after_the_results(
        tmp_path, monkeypatch):
    """The loop had ended, so the signal stopped nothing: `train` returned as if none had come
    and a caller running trainings in a row (a sweep's cells) went on to the next one. Now the
    complete run's results are written, then the signal reaches the caller's handler."""
    from hybrid_jax.data.mqar import MQARConfig
    from hybrid_jax.train import train, trainer

    evaluate = trainer._Run.evaluate

    def evaluate_then_signal(run):
        os.kill(os.getpid(), signal.SIGINT)
        return evaluate(run)

    monkeypatch.setattr(trainer._Run, "evaluate", evaluate_then_signal)
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(
        (signum, (tmp_path / "run" / "results.json").is_file())))
    try:
        experiment = hj.ExperimentConfig(
            name="late", model=hj.ModelConfig(layers=("attention",), vocab_size=16, d_model=16,
                                              num_heads=2),
            data=MQARConfig(vocab_size=16, seq_len=16, num_kv_pairs=2),
            train=hj.TrainConfig(steps=2, warmup_steps=0, batch_size=8, eval_batches=1))
        results = train(experiment, tmp_path / "run", progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert results["steps"] == 2 and results["accuracy"] is not None  # a complete run
    assert caught == [(signal.SIGINT, True)]


# Enters StopSignals, receives one SIGINT twice at once (as `timeout -s INT` delivers it: to the
# process, then to its process group), acknowledges the stop, then leaves normally.
DUPLICATED = """
import os, signal, time
from hybrid_jax.train.preemption import StopSignals
with StopSignals(grace_s=5.0, on_force_exit=lambda name: "forced") as stop:
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    while stop.received is None:
        time.sleep(0.01)
    stop.acknowledge()
    time.sleep(0.5)
print(stop.received)
"""


def test_one_signal_delivered_twice_is_not_a_second_signal():
    """`timeout -s INT 3600 hybrid-jax train ...` sometimes ended the run at once as on a second
    signal, without its checkpoint: the copy that reached the process group counted as one."""
    process = subprocess.run([sys.executable, "-c", DUPLICATED], cwd=ROOT,
                             env=os.environ.copy(), capture_output=True, text=True, timeout=60)
    assert (process.returncode, process.stdout) == (0, "SIGINT\n"), process.stderr[-3000:]
