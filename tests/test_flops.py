"""FLOP counting against hand-counted small models."""

import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, ModeSchedule, layer
from hybrid_jax.flops import (
    device_peak_flops,
    matmul_params,
    mean_document_keys,
    mean_keys,
    step_flops,
)
from hybrid_jax.modes import attention_fraction


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


def test_a_layers_own_head_dim_counts_over_the_models():
    """The model's head_dim fills each layer's unless the layer sets its own: attention's
    terms are 4·H·D with that layer's D, as its projections are."""
    config = ModelConfig(layers=(layer("attention", head_dim=32), "attention"), d_model=64,
                         num_heads=4, head_dim=8)
    assert step_flops(config, 10).attention == 4 * 4 * (32 + 8) * mean_keys(10, None)
    model = hj.create_model(config)
    assert [block.mixer.head_dim for block in model.blocks] == [32, 8]


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
    # Any change of id starts a document, a lower id (padding 0 after the documents) or one
    # that comes back: documents of 2, 1, 2 tokens.
    assert mean_document_keys(np.array([[1, 1, 2, 1, 1]]), None) == (1 + 2 + 1 + 1 + 2) / 5
    assert mean_document_keys(np.array([[3, 3, 3, 0, 0]]), None) == (1 + 2 + 3 + 1 + 2) / 5
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
    # Each uncounted type named once; a composite block with an unmodelled branch is uncounted
    # as a whole (its attention branch not counted alone).
    mixed = mamba1.replace(layers=("mamba1", "attention", "mamba1",
                                   layer("parallel", branches=("attention", "mamba1"))))
    flops = step_flops(mixed, 64)
    assert flops.uncounted == ("mamba1", "parallel")
    assert flops.attention == 4 * 32 * mean_keys(64, None) and flops.recurrence == 0


def test_parallel_blocks_count_their_branches():
    """pha-180m's attention branch is attention-only-180m's attention; its GSS adds the DSS."""
    pha, base = (step_flops(presets.get(n), 8192) for n in ("pha-180m", "attention-only-180m"))
    assert pha.attention == base.attention > 0 and not pha.uncounted
    assert pha.recurrence == 14 * (2 * 64 * 192 + 8 * 192 * 64)
    sequential = step_flops(presets.get("pha-sequential"), 8192)
    assert (sequential.attention, sequential.recurrence) == (pha.attention, pha.recurrence)


def test_every_preset_is_counted():
    """Each preset's sequence work is modelled, Oryx's too (no preset has a Mamba-1 layer)."""
    no_matmuls = nnx.State({})  # `uncounted` does not read the matmuls: no model traced
    uncounted = {name: step_flops(presets.get(name), 64, no_matmuls).uncounted
                 for name in presets.names()}
    assert {name: types for name, types in uncounted.items() if types} == {}


# Tiny Oryx layers and their forward FLOPs per token by hand: (layer, d_model, the linear
# mixer's chunked work, FLOPs per visible (query, key) pair of attention mode).
ORYX = {
    # GDN: 2 heads, K 16, V 32 (expand_v 2), C 4; attention over its heads: q·k 2·H·K, p·v 2·H·V.
    "gdn": (layer("oryx", expand_v=2, chunk_size=4), 32,
            2 * (2 * 4 * (3 * 16 + 2 * 32) + 4 * 4 / 3 + 6 * 16 * 32), 2 * (2 * 16 + 2 * 32)),
    # Mamba-2: d 64, expand 2, P 16: 8 heads, N 8, G 2, C 4; attention over its G = 2 B/C groups:
    # q·k 2·G·N, p·v 2·H·P (each group's values are its 4 value heads), not 4·N·G.
    "mamba2": (layer("oryx", linear_mixer="mamba2", ssm_head_dim=16, state_size=8, n_groups=2,
                     chunk_size=4), 64,
               2 * 2 * 4 * 8 + 8 * (2 * 4 * 16 + 4 * 8 * 16), 2 * (2 * 8 + 8 * 16)),
}


@pytest.mark.parametrize("mixer", ORYX)
def test_oryx_by_hand(mixer):
    """Oryx runs its linear mixer on every token and attention on its attention-mode rows, a
    share `attention_fraction` of them; a schedule of one mode skips the other mixer."""
    spec, d_model, recurrence, pair = ORYX[mixer]
    config = ModelConfig(layers=(spec,), d_model=d_model, num_heads=2)

    def count(fraction, model=config, length=64):
        flops = step_flops(model, length, attention_fraction=fraction)
        assert not flops.uncounted
        return flops

    def terms(fraction, model=config):
        flops = count(fraction, model)
        return flops.recurrence, flops.attention

    keys = mean_keys(64, None)  # 32.5
    assert terms(0.25) == pytest.approx((recurrence, 0.25 * pair * keys))
    assert terms(0.0) == pytest.approx((recurrence, 0))  # all linear: the linear mixer alone
    assert terms(1.0) == pytest.approx((0, pair * keys))  # all attention: no linear pass
    # Without a schedule's fraction every token is in the layer's default mode.
    assert terms(None) == terms(1.0)
    linear = config.replace(layers=(layer("oryx", default_mode="linear", **dict(spec.options)),))
    assert terms(None, linear) == terms(0.0)
    # Within documents of 3 and 7 tokens: 6 + 28 visible pairs of the row's 10 queries.
    ids = np.array([[1] * 3 + [2] * 7])
    assert count(0.25, length=10).attention_per_token(ids) == pytest.approx(
        0.25 * pair * (6 + 28) / 10)
    with pytest.raises(ValueError, match="attention_fraction"):
        count(1.5)


def test_a_schedules_attention_fraction():
    """The expected share of tokens in attention mode that a training schedule draws."""
    assert attention_fraction(ModeSchedule(pattern="random_chunks", attention_prob=0.3)) == 0.3
    assert [attention_fraction(ModeSchedule(pattern=p))
            for p in ("attention", "linear", "none")] == [1.0, 0.0, None]


@pytest.mark.parametrize("kind, peak", [
    ("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA GH200 480GB", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", None), ("TPU v6 lite", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12),
    ("TPU v4", 275e12), ("cpu", None), ("nvidia h100 80gb hbm3", 989e12), ("tpu V5P", 459e12)])
def test_peaks(kind, peak):
    assert device_peak_flops(kind) == peak


def test_linear_mixers_by_hand():
    """Each mixer's chunked work per token (module docstring), counted by hand: chunk C, state
    N or slots M, head sizes K, V (P)."""
    def recurrence(spec, length=64, **model):
        config = ModelConfig(layers=(spec,), **{"d_model": 32, "num_heads": 2, **model})
        flops = step_flops(config, length)
        assert not flops.uncounted
        return flops.recurrence, flops.attention

    # Mamba-2, d 64, expand 2, P 16: 8 heads, N 8, C 4; per group C·B 2CN, per head the
    # scores·x 2CP and the state in and out 4NP.
    mamba2 = layer("mamba2", ssm_head_dim=16, state_size=8, chunk_size=4)
    assert recurrence(mamba2, d_model=64) == (2 * 4 * 8 + 8 * (2 * 4 * 16 + 4 * 8 * 16), 0)
    mamba2_g2 = layer("mamba2", ssm_head_dim=16, state_size=8, chunk_size=4, n_groups=2)
    assert recurrence(mamba2_g2, d_model=64)[0] == 2 * 2 * 4 * 8 + 8 * (2 * 4 * 16 + 4 * 8 * 16)
    # Gated DeltaNet, 2 heads, K 16, V 32 (expand_v 2), C 4.
    gdn = 2 * (2 * 4 * (3 * 16 + 2 * 32) + 4 * 4 / 3 + 6 * 16 * 32)
    assert recurrence(layer("gdn", chunk_size=4)) == pytest.approx((gdn, 0))
    gdn_k8 = 2 * (2 * 4 * (3 * 8 + 2 * 16) + 4 * 4 / 3 + 6 * 8 * 16)  # K 8 from head_dim
    assert recurrence(layer("gdn", chunk_size=4, head_dim=8)) == pytest.approx((gdn_k8, 0))
    # GSA: two gated linear-attention passes, 2 heads, K 16, M 4, C 4.
    slots = 2 * (4 * 4 * (16 + 4) + 8 * 16 * 4)
    assert recurrence(layer("gsa", num_slots=4, chunk_size=4)) == (slots, 0)
    # NHA adds its window's band (4·K·H per pair); with the window past T the slots stay
    # empty: causal attention alone.
    nha = layer("nha", num_slots=4, window=6, chunk_size=4)
    assert recurrence(nha) == (slots, 4 * 16 * 2 * mean_keys(64, 6))
    assert recurrence(nha, length=6) == (0, 4 * 16 * 2 * mean_keys(6, None))
    # window None: causal attention alone at any length; window 0: the slots alone (GSA).
    full = layer("nha", num_slots=4, window=None, chunk_size=4)
    assert recurrence(full) == (0, 4 * 16 * 2 * mean_keys(64, None))
    assert recurrence(layer("nha", num_slots=4, window=0, chunk_size=4)) == (slots, 0)


def test_matmul_params_skip_convs_and_the_position_table():
    """Short-conv taps `[K, C]` and a learned position table `[P, D]` are 2-D but multiply
    nothing: GDN (d 32, 2 heads, K 16, V 32, no FFN) counts its seven projections alone."""
    gdn = ModelConfig(layers=(layer("gdn"),), vocab_size=10, d_model=32, num_heads=2, ffn_dim=0)
    projections = 2 * 32 * 32 + 3 * 32 * 64 + 2 * 32 * 2  # q, k; v, g, o; β, decay
    assert matmul_params(gdn) == projections + 32 * 10
    learned = gdn.replace(position_embedding="learned", max_positions=16)
    assert matmul_params(learned) == matmul_params(gdn)


def test_step_flops_counts_the_params_it_is_given():
    """A caller's `nnx.Param` state (shapes suffice) is what is counted, not a rebuild of the
    config: a twin config with a wider FFN gives its own matmuls."""
    from flax import nnx

    from hybrid_jax.nn.lm import LanguageModel

    config = ModelConfig(layers=("attention",), vocab_size=10, d_model=32, num_heads=2)
    wider = config.replace(ffn_dim=2 * config.resolved_ffn_dim)
    params = nnx.state(nnx.eval_shape(lambda: LanguageModel(wider, rngs=nnx.Rngs(0))), nnx.Param)
    assert matmul_params(wider) > matmul_params(config)
    assert step_flops(config, 8, params).matmul == 2 * matmul_params(wider)


def test_scanned_layers_count_the_matmuls_of_unscanned_ones():
    """scan_layers stacks a norm's scale or Mamba-2's D into [groups, ...]: still no matrix,
    so the 6N count (the MFU of record) is the same either way."""
    config = ModelConfig(layers=("mamba2", "attention") * 2, vocab_size=10, d_model=32,
                         num_heads=2)
    assert matmul_params(config.replace(scan_layers=True)) == matmul_params(config)


@pytest.mark.parametrize("length", [0, -8, 2.5])
def test_a_length_that_is_no_sequence_is_refused(length):
    """Counted as given: no attention FLOPs at length 0, negative ones below, silently."""
    with pytest.raises(ValueError, match=f"length must be an int >= 1, got {length}"):
        step_flops(presets.get("transformer-tiny"), length)
