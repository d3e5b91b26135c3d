"""Tiny presets on two documents packed in one row: each document's logits are those of the
document alone (`tests.helpers.assert_packed_documents_isolated`). The mixers' own tests check
their layers (the GDN and GSA mixers, Mamba, GSS and NHA models of small configs of their own,
Oryx's mixed modes in `test_oryx.py`); this one checks that the blocks hand the segment ids and
restarting positions to every branch (PHA's three)."""

import pytest

import hybrid_jax as hj
from hybrid_jax import presets
from tests.helpers import assert_packed_documents_isolated

TINY = ["transformer-tiny", "swa-transformer-tiny", "gsa-tiny", "nha-tiny", "oryx-gdn-tiny",
        "oryx-mamba2-tiny", "pha-tiny"]


@pytest.mark.parametrize("name", TINY)
def test_tiny_preset_isolates_packed_documents(name):
    assert_packed_documents_isolated(hj.create_model(presets.get(name)), lengths=(5, 11))
