"""The shipped presets' training steps take the kernels on a GPU and a TPU: one step (bf16,
packed documents, Oryx's mixed modes) traced for a faked platform (`experiments.dispatch_audit`),
no op falling to the XLA rung but the documented ones below. Shapes only, nothing runs.

One preset of each family at its real head sizes (`FAMILIES`), each traced with one layer of
each distinct layer spec (the rungs see a layer's shapes, not the depth): ≈ 0.5-1.2 s a preset
and platform on a 2-core CPU. Every preset at full depth: `python -m experiments.dispatch_audit`
(≈ 8 min). Tiny presets (head sizes 8-16) fall back by design.
"""

from __future__ import annotations

import pytest

from experiments.dispatch_audit import describe, training_choices, training_config
from hybrid_jax import presets

# The other non-tiny presets repeat these layers at these head sizes: transformer-125m/350m and
# attention-only-180m / llama-40m (heads of 64, MHA or GQA), mamba2-340m and oryx-mamba2-130m
# (P 64, N 128; values 1536 instead of 2048), nha-340m and nha-hybrid-1b (NHA heads of 256),
# oryx-gdn-130m (GDN heads of 64), the pha-* ablations and sizes (pha-180m's branches).
FAMILIES = ["transformer-125m", "transformer-1b", "gdn-130m", "gdn-340m", "mamba2-130m",
            "nha-hybrid-340m", "oryx-gdn-340m", "oryx-mamba2-340m", "pha-180m"]

# (platform, op, a fragment of the reason) -> why the fallback to the XLA rung is accepted.
DSS_CHUNKED = ("PHA's GSS branch (DSS): no DSS kernel exists; the FFT rung cannot restart at "
               "document starts, and the chunked XLA rung is the packed form by design "
               "(hybrid_jax/ops/dss.py: FFT + correction moves ~5x the bytes)")
TPU_NOT_MEASURED = ("the TPU kernels compile and pass in TPU interpret mode but never ran on a "
                    "TPU, so auto picks them on GPUs only (`auto_platforms`; the op's NOTES.md)")
ALLOWED = {
    ("gpu", "dss", "cannot restart at document starts"): DSS_CHUNKED,
    ("tpu", "dss", "cannot restart at document starts"): DSS_CHUNKED,
    ("tpu", "ssd", "only on gpu"): TPU_NOT_MEASURED,
    ("tpu", "gated_delta_rule", "only on gpu"): TPU_NOT_MEASURED,
    ("tpu", "native_hybrid_attention", "only on gpu"): TPU_NOT_MEASURED,
}


def _allowed(platform: str, choice) -> bool:
    return any(p == platform and op == choice.op and all(fragment in r for r in choice.reasons)
               for p, op, fragment in ALLOWED)


def _one_layer_each(name: str):
    config = training_config(name)
    return config.replace(layers=tuple(dict.fromkeys(config.layers)))


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.parametrize("name", FAMILIES)
def test_training_takes_the_kernels(name, platform):
    choices = training_choices(_one_layer_each(name), platform)
    ops = {choice.op for choice in choices}
    assert {"logit_stats", "rms_norm"} <= ops, (name, ops)  # the recorder saw the step
    fallbacks = [describe(c) for c in choices if c.fell_back and not _allowed(platform, c)]
    assert not fallbacks, (name, platform, fallbacks)
    if "attention" in ops:  # every attention layer of a shipped preset has a kernel
        assert {c.rung for c in choices if c.op == "attention"} <= (
            {"pallas", "cudnn"} if platform == "gpu" else {"splash"}), (name, choices)


def test_the_audit_sees_a_fallback():
    """The recorder is no silent pass: a tiny preset's heads of 16 fall back to XLA."""
    assert set(FAMILIES) <= set(presets.names())
    choices = training_choices(_one_layer_each("oryx-mamba2-tiny"), "gpu")
    fell = {c.op for c in choices if c.fell_back}
    assert {"attention", "ssd"} <= fell, choices
