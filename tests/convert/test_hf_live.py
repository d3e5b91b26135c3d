"""Live check against PyTorch (slow; needs torch + transformers): rebuild the fixtures with
make_fixtures.py in a temporary directory and compare our import with what PyTorch computed.

Runs with the Python in $HYBRID_JAX_HF_PYTHON (e.g. /work/venvs/hf/bin/python), or this one
when it has torch; skipped otherwise. CI does not install torch: the default suite compares
against the committed fixtures instead (test_hf.py).
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hybrid_jax.convert.hf_config import model_config_from_hf
from hybrid_jax.convert.hf_weights import load_hf_model
from tests.convert.test_hf import FIXTURES, MODELS

pytestmark = pytest.mark.slow


def hf_python():
    if os.environ.get("HYBRID_JAX_HF_PYTHON"):
        return os.environ["HYBRID_JAX_HF_PYTHON"]
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return sys.executable
    pytest.skip("needs torch + transformers (set HYBRID_JAX_HF_PYTHON)")


def test_import_matches_freshly_built_pytorch_models(tmp_path):
    subprocess.run([hf_python(), str(FIXTURES / "make_fixtures.py"), str(tmp_path)], check=True)
    for name in MODELS:
        directory = tmp_path / name
        config = model_config_from_hf(json.loads((directory / "config.json").read_text()))
        ref = np.load(directory / "reference.npz")
        logits = np.asarray(load_hf_model(directory, config)(ref["ids"]))
        assert np.abs(logits - ref["logits"]).max() <= 1e-4 * np.abs(ref["logits"]).max()
