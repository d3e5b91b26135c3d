"""`--shapes` of the linear-op benchmarks: the numeric and model forms, per-op fields, errors."""

from __future__ import annotations

import re

import pytest

from experiments.benchmarks.mixer_shapes import MixerShape, row_key, shape_jobs
from hybrid_jax import ModelConfig, layer, presets

GDN, SSD, GSA, NHA = ("gated_delta_rule", "ssd", "gated_slot_attention",
                      "native_hybrid_attention")


def test_numeric_forms_default_to_the_issue_shape():
    jobs, skipped = shape_jobs("4x8192,2x64x3x256,2x64x3x256x512", [GDN])
    assert [shape for _, shape in jobs] == [MixerShape(4, 8192, 16, 128, 128),
                                            MixerShape(2, 64, 3, 256, 256),
                                            MixerShape(2, 64, 3, 256, 512)]
    assert skipped == []


def test_fields_per_op():
    shape = MixerShape(2, 64, 4, 256, 512, groups=2, slots=32)
    assert shape.fields(GDN) == dict(B=2, T=64, H=4, K=256, V=512)
    assert shape.fields(SSD) == dict(B=2, T=64, H=4, K=256, V=512, G=2)
    assert shape.fields(GSA) == shape.fields(NHA) == dict(B=2, T=64, H=4, K=256, V=512, M=32)
    assert shape.fields("attention") == dict(B=2, T=64, H=4, K=256, V=256)  # cuDNN: v at K
    assert shape.label(SSD) == "B2 T64 H4 K256 V512 G2"
    assert row_key({"op": GDN, "impl": "fla", **shape.fields(GDN)}) == (
        GDN, 2, 64, 4, 256, 512, None, None)


def test_model_shapes_read_the_presets_layers():
    jobs, skipped = shape_jobs("gdn-340m@4x8192,mamba2-130m@4x8192,nha-340m@4x8192",
                               [SSD, GDN, GSA])
    assert [(op, shape.label(op)) for op, shape in jobs] == [
        (GDN, "B4 T8192 H3 K256 V512"),
        (SSD, "B4 T8192 H24 K128 V64 G1"),  # N = 128 as K, P = 64 as V
        (GSA, "B4 T8192 H4 K256 V256 M64")]
    assert skipped == ["gdn-340m@4x8192: no ssd layer, not timed",
                       "gdn-340m@4x8192: no gated_slot_attention layer, not timed",
                       "mamba2-130m@4x8192: no gated_delta_rule layer, not timed",
                       "mamba2-130m@4x8192: no gated_slot_attention layer, not timed",
                       "nha-340m@4x8192: no ssd layer, not timed",
                       "nha-340m@4x8192: no gated_delta_rule layer, not timed"]
    (op, shape), = shape_jobs("oryx-gdn-340m@1x64", [GDN])[0]  # oryx: its linear mixer's
    assert shape == MixerShape(1, 64, 16, 64, 64)
    assert [op for op, _ in shape_jobs("nha-340m@1x64", [NHA, GDN])[0]] == [NHA]


def test_a_shape_given_twice_is_one_job():
    jobs, _ = shape_jobs("4x8192x3x256x512,gdn-340m@4x8192, 4x8192x3x256x512", [GDN])
    assert len(jobs) == 1


@pytest.mark.parametrize("text, ops, message", [
    ("4x", [GDN], "expected BxT, BxTxHxK, BxTxHxKxV or MODEL@BxT"),
    ("4x8192,", [GDN], "'': expected BxT"),
    ("4x8192x3", [GDN], "got 3 numbers"),
    ("4x8192x3x256x512x2", [GDN], "got 6 numbers"),
    ("4x8192x0x128", [GDN], "MixerShape.heads=0: expected a positive integer"),
    ("4x-1", [GDN], "MixerShape.length=-1"),
    ("@4x8192", [GDN], "no model name before '@'"),
    ("gdn-340m@4x8192x3x256", [GDN], "a model shape takes BxT only"),
    ("no-such-model@4x8192", [GDN], "unknown preset 'no-such-model'"),
    ("mamba2-130m@4x8192", [GDN, GSA], "mamba2-130m runs none of"),
    ("transformer-350m@4x8192", [GDN], "runs none of"),
    ("4x8192", ["gdn"], "expected some of"),
])
def test_bad_shapes_are_refused_naming_what_was_expected(text, ops, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        shape_jobs(text, ops)


@pytest.mark.parametrize("layers, message", [
    ((layer("gdn", num_heads=2), layer("gdn", num_heads=4)), "its gated_delta_rule layers have 2"),
    ((layer("nha", num_kv_heads=2),), "NHA with 2 kv heads for 4 query heads"),
])
def test_models_without_one_shape_per_op_are_refused(monkeypatch, layers, message):
    config = ModelConfig(layers=layers, vocab_size=256, d_model=64, num_heads=4)
    monkeypatch.setattr(presets, "get", lambda name: config)
    with pytest.raises(ValueError, match=re.escape(message)):
        shape_jobs("custom@1x64", [GDN, GSA])
