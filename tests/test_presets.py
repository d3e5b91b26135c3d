"""The model presets hold the shapes their docstrings and papers give: exact parameter counts,
the sizes the docstrings round to, widths, depths, heads, windows, layer patterns, the PHA
ablations and the Oryx forms of the Mamba-2 presets."""

import dataclasses
import re

import pytest

from experiments.cli import _param_count
from hybrid_jax import presets
from hybrid_jax.config import LayerSpec, layer

# Every preset's parameter count (embeddings included, built abstractly). A change to a preset's
# shape changes its row; a new preset adds one.
PARAMS = {
    "attention-only-180m": 181_098_240, "attention-only-tiny": 48_288,
    "gdn-130m": 130_998_048, "gdn-340m": 346_996_350, "gdn-hybrid-tiny": 141_160,
    "gdn-tiny": 159_120, "gsa-hybrid-tiny": 127_360, "gsa-tiny": 131_520, "gss-tiny": 94_624,
    "llama-40m": 40_378_880, "mamba2-130m": 129_001_920, "mamba2-340m": 349_619_712,
    "mamba2-hybrid-tiny": 134_904, "mamba2-tiny": 129_056, "nha-340m": 380_183_552,
    "nha-hybrid-1b": 1_389_512_704, "nha-hybrid-340m": 380_183_552,
    "nha-hybrid-tiny": 131_520, "nha-tiny": 131_520, "oryx-gdn-130m": 138_075_936,
    "oryx-gdn-340m": 347_546_592, "oryx-gdn-tiny": 142_192, "oryx-mamba2-130m": 131_361_216,
    "oryx-mamba2-340m": 355_911_168, "oryx-mamba2-tiny": 133_152, "pha-125m": 124_488_713,
    "pha-180m": 181_473_874, "pha-90m": 89_616_026, "pha-fixed-mixing": 181_473_832,
    "pha-fixed-mixing-tiny": 47_736, "pha-no-attention": 160_819_100,
    "pha-no-attention-tiny": 41_524, "pha-no-ffn-aux": 164_958_802,
    "pha-no-ffn-aux-tiny": 43_134, "pha-no-gss": 141_885_892, "pha-no-gss-tiny": 37_612,
    "pha-sequential": 181_463_080, "pha-sequential-prenorm": 181_463_080,
    "pha-sequential-prenorm-tiny": 47_672, "pha-sequential-tiny": 47_672, "pha-tiny": 47_742,
    "swa-transformer-tiny": 115_008, "transformer-125m": 123_587_328,
    "transformer-1b": 1_100_048_384, "transformer-350m": 341_099_520,
    "transformer-tiny": 123_200,
}


def test_every_preset_has_its_parameter_count():
    assert sorted(PARAMS) == presets.names()
    counts = {name: _param_count(name) for name in presets.names()}
    assert counts == PARAMS


@pytest.mark.parametrize("name", [n for n in PARAMS if re.search(
    r"~[\d.]+[MB]", presets.PRESETS.get(n).__doc__ or "")])
def test_documented_sizes_round_to_the_count(name):
    """A docstring's "~131M" (or "~1.4B") is the count rounded to its last digit."""
    doc = presets.PRESETS.get(name).__doc__
    number, unit = re.search(r"~([\d.]+)([MB])", doc).groups()
    scale = {"M": 1e6, "B": 1e9}[unit] * 10.0 ** -len(number.partition(".")[2])
    assert round(PARAMS[name] / scale) * scale == pytest.approx(float(number) * {
        "M": 1e6, "B": 1e9}[unit]), (name, PARAMS[name])


def _shape(name):
    """(layers, d_model, heads, head size, kv heads, ffn_dim, vocab, tied) of a preset whose
    first layer has heads."""
    c = presets.get(name)
    options = c.block_options(0)
    heads = getattr(options, "num_heads", c.num_heads)
    head_dim = getattr(options, "head_dim", None) or c.head_dim or c.d_model // heads
    return (len(c.layers), c.d_model, heads, head_dim, c.kv_heads, c.ffn_dim, c.vocab_size,
            c.tie_embeddings)


@pytest.mark.parametrize("name, shape", [
    ("transformer-125m", (12, 768, 12, 64, 12, 2048, 50304, True)),
    ("transformer-350m", (24, 1024, 16, 64, 16, 2816, 32000, True)),
    ("llama-40m", (8, 512, 8, 64, 4, 1408, 16384, False)),
    ("transformer-1b", (22, 2048, 32, 64, 4, 5632, 32000, False)),
    ("transformer-tiny", (2, 64, 4, 16, 4, None, 256, True)),
    ("swa-transformer-tiny", (2, 64, 4, 16, 2, None, 256, True)),
    ("gdn-130m", (12, 768, 12, 64, 12, 2048, 50304, True)),
    ("gdn-340m", (21, 1024, 3, 256, 3, 2816, 32000, True)),
    ("gdn-tiny", (2, 64, 4, 16, 4, None, 256, True)),
    ("gsa-tiny", (2, 64, 4, 16, 4, None, 256, True)),
    ("nha-tiny", (2, 64, 4, 16, 4, None, 256, True)),
    ("nha-340m", (24, 1024, 4, 256, 4, 2816, 32000, False)),
    ("nha-hybrid-340m", (24, 1024, 4, 256, 4, 2816, 32000, False)),
    ("nha-hybrid-1b", (24, 2048, 8, 256, 8, 5632, 32000, False)),
    ("oryx-gdn-tiny", (2, 64, 4, 16, 4, None, 256, True)),
    ("oryx-gdn-130m", (12, 768, 12, 64, 12, 2048, 50304, True)),
    ("oryx-gdn-340m", (21, 1024, 16, 64, 16, 2816, 32000, True)),
    ("attention-only-180m", (14, 768, 12, 64, 3, 3776, 50304, True)),
    ("attention-only-tiny", (2, 32, 4, 8, 2, 176, 256, True)),
])
def test_documented_shapes(name, shape):
    assert _shape(name) == shape


def test_value_widths_of_the_linear_mixers():
    """gdn-130m's values are 64 wide (expand_v 1), gdn-340m's 512 (expand_v 2), gdn-tiny's 32
    (key 16, value 32)."""
    for name, expand_v in (("gdn-130m", 1), ("gdn-340m", 2), ("gdn-tiny", 2)):
        assert presets.get(name).block_options(0).expand_v == expand_v, name


@pytest.mark.parametrize("name, layers, d_model, state, ssm_head_dim, heads", [
    ("mamba2-tiny", 4, 64, 16, 16, 8), ("mamba2-130m", 24, 768, 128, 64, 24),
    ("mamba2-340m", 48, 1024, 128, 64, 32)])
def test_mamba2_shapes(name, layers, d_model, state, ssm_head_dim, heads):
    """No FFN (as in Mamba-2), expand 2: d_inner / ssm_head_dim value heads."""
    for preset in (name, f"oryx-{name}"):
        c = presets.get(preset)
        options = c.block_options(0)
        assert (len(c.layers), c.d_model, c.ffn_dim) == (layers, d_model, 0), preset
        assert (options.state_size, options.ssm_head_dim, options.n_groups) == (
            state, ssm_head_dim, 1), preset
        assert options.expand * d_model // options.ssm_head_dim == heads, preset
    assert presets.get("mamba2-340m").vocab_size == 32000


def test_oryx_mamba2_presets_are_their_mamba2_base_in_oryx_blocks():
    for size in ("tiny", "130m", "340m"):
        base, oryx = presets.get(f"mamba2-{size}"), presets.get(f"oryx-mamba2-{size}")
        assert oryx.replace(layers=base.layers) == base
        assert oryx.layers == tuple(
            layer("oryx", linear_mixer="mamba2", **dict(spec.options)) for spec in base.layers)


def test_tiny_presets_use_16_token_chunks():
    """The fastest chunk size on CPU at the tiny widths (presets.py's notes)."""
    for name in ("mamba2-tiny", "mamba2-hybrid-tiny", "gdn-tiny", "gdn-hybrid-tiny",
                 "gsa-tiny", "gsa-hybrid-tiny", "nha-tiny", "nha-hybrid-tiny", "oryx-gdn-tiny",
                 "oryx-mamba2-tiny"):
        assert presets.get(name).block_options(0).chunk_size == 16, name


def test_slots_and_modes():
    assert presets.get("gss-tiny").block_options(0).state_size == 32  # 32 modes
    for name in ("gsa-tiny", "gsa-hybrid-tiny", "nha-tiny", "nha-hybrid-tiny"):
        assert all(presets.get(name).block_options(i).num_slots == 16
                   for i in range(len(presets.get(name).layers)) if
                   presets.get(name).layers[i].type != "attention"), name
    for name in ("nha-340m", "nha-hybrid-1b"):
        options = presets.get(name).block_options(0)
        assert (options.num_slots, options.gate_logit_normalizer, options.short_conv,
                options.feature_map, options.empty_slots) == (64, 8.0, False, "swish", "mask")


def _windows(name):
    c = presets.get(name)
    return [getattr(c.block_options(i), "window", "-") for i in range(len(c.layers))]


def test_windows_and_layer_patterns():
    """The hybrids' full-window layers: the last of each group of six."""
    full = [5, 11, 17, 23]
    for name in ("nha-hybrid-340m", "nha-hybrid-1b"):
        assert _windows(name) == [None if i in full else 32 for i in range(24)], name
    assert _windows("nha-340m") == [32] * 24
    assert _windows("nha-tiny") == [16, 16]
    assert _windows("nha-hybrid-tiny") == [16, None]
    assert _windows("swa-transformer-tiny") == [16, 16]
    assert _windows("attention-only-tiny") == [4, 4]
    assert _windows("transformer-125m") == [None] * 12
    for name in ("mamba2-hybrid-tiny", "gdn-hybrid-tiny", "gsa-hybrid-tiny"):
        kinds = [spec.type for spec in presets.get(name).layers]
        assert kinds == [name.split("-")[0], "attention"], name


@pytest.mark.parametrize("size, d_model, depth", [("90m", 512, 14), ("125m", 640, 13),
                                                  ("180m", 768, 14), ("tiny", 32, 2)])
def test_pha_sizes(size, d_model, depth):
    """Heads of 64 and d_model/256 key/value heads (tiny: 4 heads, 2 kv heads, a 4-token
    window and a small GSS)."""
    c = presets.get(f"pha-{size}")
    assert (len(c.layers), c.d_model) == (depth, d_model)
    if size == "tiny":
        assert (c.num_heads, c.kv_heads, c.vocab_size) == (4, 2, 256)
        gss, attention, ffn = c.block_options(0).branches
        assert (gss, attention, ffn.type) == (
            layer("gss", expansion=2, state_size=8), layer("attention", cosine=True, window=4),
            "dual_ffn")
    else:
        assert (c.num_heads, c.kv_heads, c.vocab_size) == (d_model // 64, d_model // 256, 50304)
        assert c.block_options(0).branches[:2] == (layer("gss", expansion=2, state_size=64),
                                                   layer("attention", cosine=True))
    options = c.block_options(0)
    assert (options.layout, options.residual, options.mixing) == (
        "parallel", "deepnorm", "learned")


def test_pha_ablations_change_one_thing_of_pha_180m_and_pha_tiny():
    """Each `pha-<ablation>` is pha-180m with the ablation's options, `-tiny` pha-tiny with them
    (its branches at the tiny sizes)."""
    expected = {
        "sequential": dict(layout="sequential", branch_norm=False, mixing="sum",
                           residual="deepnorm"),
        "sequential-prenorm": dict(layout="sequential", branch_norm=False, mixing="sum",
                                   residual="pre_norm"),
        "no-attention": dict(branches=("gss", "dual_ffn")),
        "no-gss": dict(branches=("attention", "dual_ffn")),
        "no-ffn-aux": dict(branches=("gss", "attention", "ffn")),
        "fixed-mixing": dict(mixing="fixed"),
    }
    assert sorted(presets.PHA_ABLATIONS) == sorted(expected)
    for ablation, changes in expected.items():
        for base, suffix in (("pha-180m", ""), ("pha-tiny", "-tiny")):
            name = f"pha-{ablation}{suffix}"
            assert presets.describe(name) == f"PHA ablation ({ablation}) of {base}"
            config, reference = presets.get(name), presets.get(base)
            options, plain = config.block_options(0), reference.block_options(0)
            assert config.replace(layers=reference.layers) == reference, name
            for field, value in changes.items():
                if field == "branches":
                    kinds = tuple(LayerSpec.parse(b).type for b in options.branches)
                    assert kinds == value, name
                    # the kept mixers are the base preset's (tiny: the small GSS, window 4)
                    kept = {b.type: b for b in plain.branches}
                    assert all(b == kept[b.type] for b in options.branches
                               if b.type in ("gss", "attention")), name
                else:
                    assert getattr(options, field) == value, (name, field)
            changed = {f.name for f in dataclasses.fields(options)
                       if getattr(options, f.name) != getattr(plain, f.name)}
            assert changed <= set(changes), name
