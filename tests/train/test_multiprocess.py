"""Multi-process training for real: `hybrid-jax train` in 2 (and 4) CPU processes on this
machine (a localhost coordinator on a free port, 4 devices in all) logs the losses of one
process with 4 devices and the same global batch, evaluates the same held-out tokens once (not
once per process), and its checkpoint (written by every process) resumes on one process and on
four like the one-process run's own checkpoint does. SIGTERM to one process stops every process
at the same step, and they resume to the uninterrupted losses.

The 2-process run and its resume on one process are the default suite; 4 processes and the
signal test are `slow` (each process compiles the step on the 2 shared cores)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from experiments import registry
from hybrid_jax.config import MeshConfig, apply_overrides, to_dict
from hybrid_jax.distributed import ENVIRONMENT, initialize
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.trainer import check_process_rows

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 4
SETTINGS = ["train.batch_size=8", "train.log_every=1", "train.warmup_steps=1",
            "train.eval_batches=1", "data.seq_len=32"]
COMMON = ["train", "mqar-hybrid-tiny", "--quiet"] + [a for s in SETTINGS for a in ("--set", s)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(processes: int, process_id: int | None = None, port: int | None = None) -> dict:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    flags.append(f"--xla_force_host_platform_device_count={DEVICES // processes}")
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    if processes > 1:  # read by hybrid_jax.distributed.initialize
        env.update(HYBRID_JAX_COORDINATOR=f"localhost:{port}",
                   HYBRID_JAX_NUM_PROCESSES=str(processes),
                   HYBRID_JAX_PROCESS_ID=str(process_id))
    return env


def _launch(command: list[str], processes: int) -> list[subprocess.Popen]:
    """`processes` copies of `python COMMAND` forming one job."""
    port = _free_port()
    return [subprocess.Popen([sys.executable, *command], cwd=ROOT, env=_env(processes, i, port),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(processes)]


def _finish(processes: list[subprocess.Popen], returncode: int = 0) -> list[str]:
    outputs = []
    for p in processes:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == returncode, out[-3000:]
        outputs.append(out)
    return outputs


def _train(out: Path, steps: int, processes: int = 1, *extra: str) -> None:
    args = [*COMMON, "--out", str(out), "--set", f"train.steps={steps}", *extra]
    _finish(_launch(["-m", "experiments.cli", *args], processes))


def _losses(run: Path) -> dict[int, float]:
    if not (run / "metrics.jsonl").is_file():
        return {}
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


def _flops_per_token(run: Path) -> list[float]:
    return [r["tflops_per_device"] * 1e12 / r["tokens_per_s_per_device"]
            for r in read_metrics(run) if "tflops_per_device" in r and r["step"] <= 3]


def _results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 3-step 2-process run, and the one-process run of 3 steps then resumed to 5."""
    root = tmp_path_factory.mktemp("multiprocess")
    one, two = root / "one", root / "two"
    _train(two, 3, 2)
    _train(one, 3)
    first = _losses(one), _results(one)
    _train(one, 5, 1, "--resume")
    return {"two": two, "one": one, "one_3": first[0], "one_3_results": first[1],
            "one_5": _losses(one)}


def _resumed_copy(runs, tmp_path: Path, processes: int) -> dict[int, float]:
    """The 2-process checkpoint resumed to step 5 on `processes` processes."""
    run = tmp_path / f"two-on-{processes}"
    shutil.copytree(runs["two"], run)
    _train(run, 5, processes, "--resume")
    return _losses(run)


def test_a_mesh_that_does_not_split_the_batch_across_processes_is_refused(monkeypatch):
    # As process 1 of 2 whose devices all hold every row (here: every device is this one's).
    mesh = make_mesh(MeshConfig(data=1, tensor=4), jax.devices()[:4])
    check_process_rows(mesh, 8)  # one process: nothing to check
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with pytest.raises(ValueError, match=r"process 1 of 2: its devices hold batch rows "
                                         r"\[0, 1, 2, 3, 4, 5, 6, 7\]\.\.\., not its own 4\.\.7"):
        check_process_rows(mesh, 8)


@pytest.fixture
def joined(monkeypatch):
    """The keyword arguments of every `jax.distributed.initialize` call (stubbed: nothing
    joins a job), with none of the HYBRID_JAX_* variables set."""
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    for name in ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    return calls


def test_initialize_takes_the_flags_then_the_environment(joined, monkeypatch):
    """Nothing set: one process, JAX not told anything. A flag wins over its variable, even
    process 0 (falsy); the variables fill in the rest, device ids as a list of integers."""
    assert initialize() is False and joined == []
    for name, value in (("coordinator", "host0:1234"), ("num_processes", "4"),
                        ("process_id", "3"), ("local_device_ids", "0, 2")):
        monkeypatch.setenv(ENVIRONMENT[name], value)
    assert initialize(process_id=0) is True
    assert joined == [dict(coordinator_address="host0:1234", num_processes=4, process_id=0,
                           local_device_ids=[0, 2], cluster_detection_method="deactivate")]
    monkeypatch.setenv(ENVIRONMENT["num_processes"], "four")
    with pytest.raises(ValueError, match="HYBRID_JAX_NUM_PROCESSES='four': expected an integer"):
        initialize()


def test_initialize_refuses_incomplete_settings_unless_auto(joined):
    """A partial description of the job, or a process id outside [0, num_processes), is an
    error before JAX is called; with `auto`, JAX detects the cluster and fills in the rest."""
    with pytest.raises(ValueError, match="missing: process_id"):
        initialize("host0:1234", 2)
    with pytest.raises(ValueError, match=r"process_id=2 is not in \[0, num_processes=2\)"):
        initialize("host0:1234", 2, 2)
    for address in ("host0", "host0:", ":1234", "host0:http", "host0:70000", "host0:0"):
        with pytest.raises(ValueError, match=rf"coordinator='{address}': expected HOST:PORT"):
            initialize(address, 2, 0)  # "host0" was an IndexError inside JAX
    with pytest.raises(ValueError, match=r"num_processes=0: expected at least 1"):
        initialize("host0:1234", 0, 0)
    for ids in ([0, 0], [-1], []):
        with pytest.raises(ValueError, match=rf"local_device_ids=\{ids}: expected distinct "):
            initialize("host0:1234", 2, 0, ids)
    # Device ids alone describe no job: not a silent single-process run that ignores them.
    with pytest.raises(ValueError, match="missing: coordinator, num_processes, process_id"):
        initialize(local_device_ids=[0, 1])
    # A negative process id is refused with auto too, where JAX counts the processes.
    with pytest.raises(ValueError, match=r"process_id=-1 is not in \[0, num_processes=\?\)"):
        initialize(process_id=-1, auto=True)
    assert joined == []
    assert initialize("[::1]:1234", 2, 1) is True
    assert joined.pop()["coordinator_address"] == "[::1]:1234"
    assert initialize(auto=True) is True
    assert initialize(num_processes=2, auto=True) is True
    assert joined == [dict(coordinator_address=None, num_processes=n, process_id=None,
                           local_device_ids=None) for n in (None, 2)]


def test_a_job_given_in_full_is_not_redescribed_by_jax_cluster_detection(joined):
    """Without `auto`, JAX's cluster detection is off: under SLURM (or Open MPI) it filled in
    the unset local_device_ids with the process's local rank, [0] for one process a host, so
    that process used one of its host's devices instead of all of them (the documented
    default), silently. With `auto` it stays on (that is what auto asks for)."""
    assert initialize("host0:1234", 2, 0) is True
    assert initialize(auto=True) is True
    assert [call.get("cluster_detection_method") for call in joined] == ["deactivate", None]


def test_two_processes_train_like_one_and_resume_on_one(runs, tmp_path):
    assert sorted(runs["one_3"]) == [1, 2, 3]
    assert _losses(runs["two"]) == pytest.approx(runs["one_3"], rel=1e-5)
    assert not list(runs["two"].glob("metrics.jsonl*.tmp"))
    # The logged model FLOPs per token (TFLOP/s per device over tokens/s per device): each
    # process counts its own rows on its own devices.
    assert _flops_per_token(runs["two"]) == pytest.approx(_flops_per_token(runs["one"]),
                                                           rel=1e-6)
    # Eval: the same held-out tokens, counted once (each process evaluates only its rows).
    two, one = _results(runs["two"]), runs["one_3_results"]
    assert two["eval_tokens"] == one["eval_tokens"] > 0
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-5)
    # Resumed on one process: the 2-process checkpoint continues like the 1-process one.
    assert sorted(runs["one_5"]) == [1, 2, 3, 4, 5]
    assert _resumed_copy(runs, tmp_path, 1) == pytest.approx(runs["one_5"], rel=1e-5)


@pytest.mark.slow
def test_four_processes_train_like_one_and_resume_a_two_process_checkpoint(runs, tmp_path):
    four = tmp_path / "four"
    _train(four, 3, 4)
    assert _losses(four) == pytest.approx(runs["one_3"], rel=1e-5)
    assert _results(four)["eval_tokens"] == runs["one_3_results"]["eval_tokens"]
    assert _resumed_copy(runs, tmp_path, 4) == pytest.approx(runs["one_5"], rel=1e-5)


def _driver(run: Path, delay: float, processes: int) -> list[subprocess.Popen]:
    """`tests.train.run_driver` (train with resume, each batch delayed) as a job."""
    config = run.parent / f"{run.name}.json"
    experiment = apply_overrides(registry.get("mqar-hybrid-tiny"),
                                 [*SETTINGS, "train.steps=8", "train.checkpoint_every=100"])
    config.write_text(json.dumps(to_dict(experiment)))
    return _launch(["-m", "tests.train.run_driver", str(config), str(run), str(delay)],
                   processes)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_at_one_step(tmp_path):
    reference, run = tmp_path / "reference", tmp_path / "run"
    _finish(_driver(reference, 0.0, 1))
    job = _driver(run, 0.5, 2)
    deadline = time.monotonic() + 600
    while len(_losses(run)) < 2:
        assert all(p.poll() is None for p in job), "the job ended before the signal"
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.05)
    job[1].send_signal(signal.SIGTERM)  # not the process that writes the logs
    stops = [json.loads(out.strip().splitlines()[-1]) for out in _finish(job, 128 + 15)]
    assert stops[0] == stops[1] and stops[0]["interrupted"] == "SIGTERM", stops
    step = stops[0]["step"]
    assert 2 <= step < 8
    assert (run / "checkpoints" / str(step)).is_dir()  # saved by both processes
    _finish(_driver(run, 0.0, 2))  # resumed by the same job shape
    assert _losses(run) == pytest.approx(_losses(reference), rel=1e-5)
    assert sorted(_losses(run)) == list(range(1, 9))
