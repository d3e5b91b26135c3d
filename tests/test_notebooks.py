"""The notebooks of colab/: stored without outputs, each with its Colab badge, install cell and
knob, and each executed top to bottom in its own kernel on CPU (nbclient).

A kernel is a separate process: it gets this environment with the repository on PYTHONPATH,
JAX on the CPU, and conftest.py's XLA_FLAGS less its 8 fake devices (a notebook sets what it
needs itself, e.g. the sharding notebook's 8 fake CPU devices). Its cheap-code flags make
compiles ~3x cheaper and compiled steps ~3x slower, so the quickstart, which runs 300 training
steps, goes without them; every other notebook spends more compiling than running. The
notebooks that train run shorter in the default suite (`HYBRID_JAX_NOTEBOOK_QUICK=1`, read in
their knob cell: the language models 100 of 200, 50 of 150 or 20 of 150 steps, the quickstart
32-token sequences) and as users run them in the slow one. A notebook asserts its own results, so a
wrong number fails here like an exception.
"""

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import CHEAP_CODE_FLAGS

ROOT = Path(__file__).resolve().parents[1]
COLAB = ROOT / "colab"
NAMES = ("quickstart", "mixers", "nha-window", "expressivity", "sharding", "pha-mixing",
         "oryx-modes", "from-llama")
# The repository placeholder of the badges and install cells (colab/README.md says how to set it).
BADGE = re.compile(r'href="https://colab\.research\.google\.com/github/([^/"]+/[^/"]+)'
                   r'/blob/main/colab/([^/"]+)\.ipynb"')
REPOSITORY = re.compile(r'^REPOSITORY = "https://github\.com/([^/"]+/[^/"]+)"', re.M)
KNOB = re.compile(r"^(BIG|HF_DIR) = (False|None)  # <- the knob", re.M)
HJ_NAME = re.compile(r"\bhj((?:\.[A-Za-z_]\w*)+)(\(?)")  # `hj.a.b`, and `(` if called
QUICK = "HYBRID_JAX_NOTEBOOK_QUICK"  # set here; a training notebook then runs fewer steps


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(COLAB / f"{name}.ipynb", as_version=4)


def test_the_notebooks_are_the_listed_ones():
    assert sorted(p.stem for p in COLAB.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    notebook = read(name)
    nbformat.validate(notebook)
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"colab/{name}.ipynb cell {i} has outputs: clear them before committing "
                "(colab/README.md)")
        assert "execution" not in cell.metadata, f"cell {i} carries execution timings"
    assert "widgets" not in notebook.metadata


@pytest.mark.parametrize("name", NAMES)
def test_badge_install_cell_and_knob(name):
    cells = read(name).cells
    badge = BADGE.search(cells[0].source)
    assert badge and badge[2] == name, "the first cell opens with a badge to this notebook"
    install = cells[1].source
    assert install == read("quickstart").cells[1].source, "every notebook has the same install"
    assert REPOSITORY.search(install)[1] == badge[1], "badge and install name one repository"
    assert 'find_spec("hybrid_jax") is None' in install
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    assert KNOB.search(code), "a knob line `BIG = False  # <- the knob` (or HF_DIR = None)"
    assert "jax.devices()" in code, "a device check"


@pytest.mark.parametrize("name", NAMES)
def test_the_hj_names_they_use_exist(name):
    """Every `hj.a.b` a notebook names, in code or text, is in the package (`import hybrid_jax
    as hj`), and is callable where it is called: a reader copying it gets no AttributeError
    and no "'module' object is not callable"."""
    import hybrid_jax

    for cell in read(name).cells:
        for dotted, called in sorted(set(HJ_NAME.findall(cell.source))):
            target = hybrid_jax
            for part in dotted.split(".")[1:]:
                assert hasattr(target, part), f"colab/{name}.ipynb names hj{dotted}: no {part}"
                target = getattr(target, part)
            assert callable(target) or not called, f"colab/{name}.ipynb calls hj{dotted}"


def kernel_environment(name: str, quick: bool, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", QUICK)}
    env["TMPDIR"] = str(tmp)  # what a notebook makes with tempfile goes with the test's tmp_path
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in (env.get("PYTHONPATH"),) if p])
    env["JAX_PLATFORMS"] = "cpu"
    if quick:
        env[QUICK] = "1"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    if name == "quickstart":
        flags = [f for f in flags if f not in CHEAP_CODE_FLAGS]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def execute(name: str, quick: bool, tmp: Path) -> None:
    client = NotebookClient(read(name), timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(COLAB)}})
    # raises CellExecutionError naming the cell
    client.execute(env=kernel_environment(name, quick, tmp))


@pytest.mark.parametrize("name", NAMES)
def test_runs_top_to_bottom(name, tmp_path):
    execute(name, quick=True, tmp=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if QUICK in read(n).cells[4].source])
def test_runs_top_to_bottom_with_all_its_steps(name, tmp_path):
    execute(name, quick=False, tmp=tmp_path)
