"""FLOP counting against hand-counted small models."""

import numpy as np
import pytest

from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.flops import (
    device_peak_flops,
    matmul_params,
    mean_document_keys,
    mean_keys,
    step_flops,
)


def test_transformer_by_hand():
    config = presets.get("transformer-tiny")  # 2 layers, d 64, 4 heads, vocab 256, tied
    d, ffn, vocab, length = 64, config.resolved_ffn_dim, 256, 10
    matmuls = 2 * (4 * d * d + 3 * d * ffn) + d * vocab
    assert matmul_params(config) == matmuls
    flops = step_flops(config, length)
    assert flops.matmul == 2 * matmuls
    assert flops.attention == 2 * 4 * d * (length + 1) / 2  # 2 layers, H·D = d, causal half
    assert flops.training_per_token() == 3 * (2 * matmuls + flops.attention)
    assert flops.six_n == 6 * matmuls
    untied = ModelConfig(layers=("attention",), vocab_size=256, d_model=64, num_heads=4,
                         tie_embeddings=False)
    # The input embedding is a lookup, not a product: only the head counts.
    assert matmul_params(untied) == 4 * d * d + 3 * d * untied.resolved_ffn_dim + d * vocab


def test_window_counts_its_band():
    assert mean_keys(10, None) == 5.5
    assert mean_keys(10, 3) == (1 + 2 + 3 * 8) / 10
    assert mean_keys(10, 50) == mean_keys(10, None)
    base = ModelConfig(layers=(layer("attention", window=3),), d_model=32, num_heads=2)
    assert step_flops(base, 10).attention == 4 * 32 * mean_keys(10, 3)


def test_packed_rows_count_each_document_as_its_triangle():
    """Documents of 3 and 7 tokens in a 10-token row: 6 + 28 pairs, not the row's 55."""
    ids = np.array([[1] * 3 + [2] * 7])
    assert mean_document_keys(ids, None) == (6 + 28) / 10
    assert mean_document_keys(ids, 2) == (1 + 2 + 2 + 1 + 2 * 6) / 10
    assert mean_document_keys(np.zeros((2, 10), int), None) == mean_keys(10, None)
    base = ModelConfig(layers=(layer("attention", window=2), "attention"), d_model=32,
                       num_heads=2)
    flops = step_flops(base, 10)
    assert flops.attention_per_token(ids) == 4 * 32 * ((6 + 28) / 10 + 18 / 10)
    assert flops.training_per_token(ids) < flops.training_per_token()  # the row overstates


def test_recurrences_and_uncounted():
    mamba = step_flops(presets.get("mamba2-tiny"), 64)
    assert mamba.attention == 0 and mamba.recurrence > 0 and not mamba.uncounted
    gss = step_flops(presets.get("gss-tiny"), 64)  # DSS width 16, 32 modes, chunks of 64
    assert gss.recurrence == 2 * (2 * 64 * 16 + 8 * 16 * 32) and not gss.uncounted
    assert gss.training_per_token() == 3 * (gss.matmul + gss.recurrence)
    mamba1 = ModelConfig(layers=(layer("mamba1"),), d_model=32, num_heads=2)
    assert step_flops(mamba1, 64).uncounted == ("mamba1",)


def test_parallel_blocks_count_their_branches():
    """pha-180m's attention branch is attention-only-180m's attention; its GSS adds the DSS."""
    pha, base = (step_flops(presets.get(n), 8192) for n in ("pha-180m", "attention-only-180m"))
    assert pha.attention == base.attention > 0 and not pha.uncounted
    assert pha.recurrence == 14 * (2 * 64 * 192 + 8 * 192 * 64)
    sequential = step_flops(presets.get("pha-sequential"), 8192)
    assert (sequential.attention, sequential.recurrence) == (pha.attention, pha.recurrence)


@pytest.mark.parametrize("kind, peak", [
    ("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA GH200 480GB", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", None), ("TPU v6 lite", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12),
    ("TPU v4", 275e12), ("cpu", None)])
def test_peaks(kind, peak):
    assert device_peak_flops(kind) == peak
