"""`experiments/benchmarks/gpu_checks.sh`: it names every kernel package of `pallas_kernels/`, each
of its commands parses with its benchmark's own argument parser, and an unknown kernel is
refused. (The checks themselves need a GPU: not run here.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers import parsed_by_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "benchmarks" / "gpu_checks.sh"
CASE = re.compile(r"^\s+(\w+)\) check \"\$kernel\" (\d+) (\d+) python3 -m "
                  r"experiments\.benchmarks\.(\w+) (.*?) ;;$", re.M)


def cases() -> dict[str, tuple[str, list[str]]]:
    """kernel → (benchmark module, its arguments) of the script's case statement."""
    text = re.sub(r" \\\n\s*", " ", SCRIPT.read_text())
    return {m[1]: (m[4], shlex.split(m[5])) for m in CASE.finditer(text)}


def default_kernels() -> list[str]:
    text = re.sub(r"\n\s+", " ", SCRIPT.read_text())
    return re.search(r"KERNELS=\(([\w ]+)\)", text)[1].split()


def test_every_kernel_package_has_a_check_and_runs_by_default():
    packages = sorted(p.parent.name for p in (ROOT / "pallas_kernels").glob("*/__init__.py"))
    assert sorted(cases()) == packages
    assert sorted(default_kernels()) == packages


@pytest.mark.parametrize("kernel", sorted(cases()))
def test_check_command_parses(kernel):
    module_name, args = cases()[kernel]
    parsed = parsed_by_main(f"experiments.benchmarks.{module_name}",
                            [*args, "--out", "/nonexistent/x.json"])
    assert parsed.out is not None


def test_a_failing_check_is_reported_and_archived(tmp_path):
    """A check whose command fails prints its exit status; ARCHIVE=1 packs what was written."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\necho 'Traceback: no GPU'\nexit 3\n")
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(SCRIPT), "logit_stats", "ssd"], capture_output=True, text=True,
        env={"OUT": str(out), "ARCHIVE": "1", "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "== logit_stats: rc=3" in result.stdout and "== ssd: rc=3" in result.stdout
    assert "Traceback: no GPU" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_checks.tgz"]
    with tarfile.open(out / "gpu_checks.tgz") as archive:
        assert sorted(archive.getnames()) == ["logit_stats.log", "ssd.log"]


def test_an_unknown_kernel_is_refused():
    result = subprocess.run(["bash", str(SCRIPT), "flash"], capture_output=True, text=True,
                            env={"OUT": "/tmp/gpu_checks_test", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and "unknown kernel flash" in result.stdout
