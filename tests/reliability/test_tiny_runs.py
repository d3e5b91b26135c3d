"""Every tiny experiment and tiny preset trains a few steps without hanging (subprocesses
under a timeout: a hung XLA computation cannot be interrupted in-process), and the README's
main job reaches its stated accuracy (slow)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.corpus_helpers import write_corpus
from tests.reliability.tiny_driver import tiny_runs

ROOT = Path(__file__).resolve().parents[2]
PARTS = 3
TIMEOUT_S = 900  # 5 models per part: about 75 s of CPU, up to 6 min on a loaded machine


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("part", range(PARTS))
def test_every_tiny_model_trains(corpus, part):
    names = list(tiny_runs(corpus))[part::PARTS]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.reliability.tiny_driver", str(corpus), str(part),
             str(PARTS)], cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True,
            timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        finished = re.findall(r"^ok (.*)$", out, re.M)
        raise AssertionError(f"hung (no result in {TIMEOUT_S} s): "
                             f"{names[len(finished)]!r}; finished: {finished}") from None
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.findall(r"^ok (.*)$", done.stdout, re.M) == names


@pytest.mark.slow
def test_readme_main_job_reaches_its_accuracy(tmp_path):
    """`hybrid-jax train mqar-hybrid-tiny` (the README's first command): accuracy 0.9…"""
    done = subprocess.run([sys.executable, "-m", "experiments.cli", "train", "mqar-hybrid-tiny",
                           "--out", str(tmp_path / "run"), "--quiet"], cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(re.search(r"^accuracy (\S+)$", done.stdout, re.M).group(1))
    assert accuracy >= 0.9, done.stdout[-2000:]
