"""Gated delta rule TPU kernels (`pallas_kernels/delta_rule/tpu.py`): TPU interpret mode on the
CPU against the per-token reference (float32, 1e-5: values and gradients of every input), and
the non-interpreted forward and backward lowered to Mosaic at real shapes (block shapes within
the (8, 128) rule, every op of the kernel bodies lowered; Mosaic's own compile needs a TPU).

Interpret mode compiles slowly: one default case covers documents, an initial state and an odd
length together; the rest is marked slow.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.delta_rule import api
from tests.helpers import lower_for_tpu
from tests.pallas.test_delta_rule_kernel import (
    TINY,  # chunk 8; the TPU kernels read only the chunk
    check_against_reference,
    check_bfloat16,
    make_inputs,
)

CHUNK_16 = dataclasses.replace(TINY, chunk=16)


def documents(length: int) -> jnp.ndarray:
    """One row: documents start at 5 (inside a chunk of 8), 8 (on a chunk edge), 9 (so 8 is a
    length-1 document), 16, 17, 23, 24 (length 1) and at the last step (length 1); ids reused
    (a start is a change of id)."""
    ids = np.zeros((1, length), np.int32)
    for start, doc in ((5, 1), (8, 2), (9, 1), (16, 3), (17, 4), (23, 5), (24, 6),
                       (length - 1, 0)):
        ids[0, start:] = doc
    return jnp.asarray(ids)


def test_documents_initial_state_odd_length(x64):
    """T = 37 (padded to 40, five chunks of 8: the inverse merges 2 → 4 → 8), K = 16 ≠ V = 8,
    two heads (a weak and a strong decay), documents on and off chunk edges, an initial state
    that reaches the first document only; values from the forward that saves the backward's
    residuals."""
    x = make_inputs(0, batch=1, length=37, key_dim=16, value_dim=8)
    check_against_reference(x, documents(37), 0.4, primal=False, backend="tpu")


@pytest.mark.slow
def test_no_documents_chunk_16(x64):
    """Without documents (the mask-free path), chunk 16 (merges 2 → 4 → 8 → 16), two rows,
    values from the primal forward."""
    x = make_inputs(1, batch=2, length=40, key_dim=8, value_dim=16)
    check_against_reference(x, None, None, primal=True, blocks=CHUNK_16, backend="tpu")


@pytest.mark.slow
def test_bfloat16_within_rounding(x64):
    """bf16 q, k, v: the bf16 paths (split merges, U₀'s split T, dK̃'s split dS₁) within bf16
    rounding of the float64 reference, with documents, chunk 16."""
    check_bfloat16(documents(45), CHUNK_16, backend="tpu")


@pytest.mark.parametrize("key_dim,value_dim,packed", [
    (128, 128, True), (64, 64, True), (256, 256, True), (128, 64, False)])
def test_kernels_lower_to_mosaic(monkeypatch, key_dim, value_dim, packed):
    """Forward and backward (not interpreted) lower to Mosaic TPU kernels at B4 T8192 H16,
    bf16, the default chunk (64): with documents and an initial state at K = V = 64, 128, 256;
    without either at K = 128, V = 64."""
    monkeypatch.setattr(api, "_platform", lambda: "tpu")
    batch, length, heads = 4, 8192, 16
    rows = (batch, length, heads)
    spec = jax.ShapeDtypeStruct
    arrays = [spec(rows + (key_dim,), jnp.bfloat16), spec(rows + (key_dim,), jnp.bfloat16),
              spec(rows + (value_dim,), jnp.bfloat16), spec(rows, jnp.float32),
              spec(rows, jnp.float32)]
    if packed:
        arrays += [spec((batch, heads, key_dim, value_dim), jnp.float32),
                   spec((batch, length), jnp.bool_)]
    assert api.unsupported(*arrays) is None

    def loss(q, k, v, g, beta, state=None, starts=None):
        out, final_state = api.gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                starts=starts)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(final_state)

    text = lower_for_tpu(jax.value_and_grad(loss, argnums=tuple(range(len(arrays) - packed))),
                         *arrays)
    # the forward saving the entering states, then the backward
    assert text.count("tpu_custom_call") == 2
    for name in ("gated_delta_rule_tpu_forward", "gated_delta_rule_tpu_backward"):
        assert name in text


def test_tpu_unsupported_calls_name_the_reason(monkeypatch):
    x = make_inputs(2, batch=1, length=8)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    assert api.unsupported(*args, backend="tpu", interpret=True) is None
    assert "TPU kernels were asked for, the platform is 'cpu'" in api.unsupported(
        *args, backend="tpu")
    monkeypatch.setattr(api, "_platform", lambda: "tpu")
    assert "head dim K=16 (the TPU kernels take" in api.unsupported(*args)
    wide = make_inputs(2, batch=1, length=8, key_dim=64, value_dim=256)
    wide = [wide[n] for n in ("q", "k", "v", "g", "beta")]
    assert api.unsupported(*wide) is None
    assert "chunk 16 (the TPU kernels take (64, 128))" in api.unsupported(
        *wide, block_sizes=CHUNK_16)
    assert api.unsupported(*wide, block_sizes=dataclasses.replace(TINY, chunk=128)) is None
