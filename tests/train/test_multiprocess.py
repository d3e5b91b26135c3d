"""Multi-process training for real: `hybrid-jax train` in 2 CPU processes on this machine
(a localhost coordinator on a free port, 2 devices each) logs the losses of one process with
4 devices and the same global batch, and its checkpoint (written by both processes) resumes
on one process like the one-process run's own checkpoint does."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["train", "mqar-hybrid-tiny", "--quiet", "--set", "train.batch_size=8",
          "--set", "train.log_every=1", "--set", "train.warmup_steps=1",
          "--set", "train.eval_batches=1", "--set", "data.seq_len=32"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(args: list[str], devices: int) -> subprocess.Popen:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if "device_count" not in f] + [f"--xla_force_host_platform_device_count={devices}"]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "experiments.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(*processes: subprocess.Popen) -> None:
    for p in processes:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]


def _train(out: Path, steps: int, processes: int = 1, *extra: str) -> None:
    args = [*COMMON, "--out", str(out), "--set", f"train.steps={steps}", *extra]
    if processes == 1:
        _finish(_start(args, 4))
        return
    port = _free_port()
    _finish(*(_start([*args, "--coordinator", f"localhost:{port}", "--num-processes",
                      str(processes), "--process-id", str(i)], 4 // processes)
              for i in range(processes)))


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_two_processes_train_like_one_and_resume_on_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _train(two, 3, 2)
    _train(one, 3)
    expected = _losses(one)
    assert sorted(expected) == [1, 2, 3]
    assert _losses(two) == pytest.approx(expected, rel=1e-5)
    assert not (two / "metrics.jsonl.tmp").exists()
    # Resumed on one process: the 2-process checkpoint continues like the 1-process one.
    _train(one, 5, 1, "--resume")
    _train(two, 5, 1, "--resume")
    resumed = _losses(one)
    assert sorted(resumed) == [1, 2, 3, 4, 5]
    assert _losses(two) == pytest.approx(resumed, rel=1e-5)
