"""Every experiment and benchmark script's `--help` gives its docstring's whole first paragraph
(a first line alone cut sentences mid-way: "... TFLOP/s and MFU")."""

import faulthandler
import importlib
import sys
from pathlib import Path

import pytest

from experiments.help_text import first_paragraph

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for path in (ROOT / "experiments").rglob("*.py")
    if "first_paragraph(__doc__)" in path.read_text())


def test_first_paragraph_joins_the_lines_of_the_first_paragraph_only():
    doc = "Full steps: tokens/s and MFU\nper device,  memory.\n\n    python -m x\n"
    assert first_paragraph(doc) == "Full steps: tokens/s and MFU per device, memory."


def test_every_script_that_describes_itself_is_found():
    assert len(SCRIPTS) >= 29 and "experiments.benchmarks.train_throughput" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_prints_the_first_paragraph(name, monkeypatch, capfd):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    monkeypatch.setattr(faulthandler, "register", lambda *args, **kwargs: None)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"]) if _takes_argv(module.main) else module.main()
    assert exit_.value.code == 0
    printed = " ".join(capfd.readouterr().out.split())
    paragraph = module.__doc__.strip().split("\n\n")[0]  # the description, independently
    assert " ".join(paragraph.split()) in printed


def _takes_argv(main) -> bool:
    return main.__code__.co_argcount > 0
