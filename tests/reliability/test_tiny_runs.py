"""Every tiny experiment and tiny preset trains a few steps without hanging (subprocesses
under a timeout: a hung XLA computation cannot be interrupted in-process): each model and data
kind in the default suite, the same models at the other experiments' vocabulary sizes in the
slow one, where the README's main job also reaches its stated accuracy."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.corpus_helpers import write_corpus
from tests.reliability.tiny_driver import part_of, split_runs, tiny_runs

ROOT = Path(__file__).resolve().parents[2]
PARTS = 4  # balanced: each about 30 s of CPU (xdist spreads them over its workers)
TIMEOUT_S = 900  # 6 or 7 models per part: up to 3 min on a loaded machine


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("part", range(PARTS))
def test_every_tiny_model_trains(corpus, part):
    """Each model once, and each data kind; the slow test below adds the same models at the
    other experiments' vocabulary sizes and data (tiny_driver.split_runs)."""
    _train_part(corpus, part, PARTS, slow=False)


@pytest.mark.slow
def test_every_tiny_model_trains_at_the_other_vocabulary_sizes(corpus):
    _train_part(corpus, 0, 1, slow=True)


def _train_part(corpus, part: int, parts: int, *, slow: bool) -> None:
    names = list(part_of(split_runs(tiny_runs(corpus))[slow], part, parts))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.reliability.tiny_driver", str(corpus), str(part),
             str(parts)] + ["slow"] * slow, cwd=ROOT, env=os.environ.copy(),
            capture_output=True, text=True, timeout=TIMEOUT_S)
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
