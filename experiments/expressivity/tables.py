"""The study's sweeps, reduced to run on a CPU in minutes to tens of minutes each.

`python -m experiments.run expressivity/<name> --out DIR [--set key=value ...]`; larger grids
(more budgets, seeds, steps) are `--set` overrides, listed in experiments/README.md.
"""

from __future__ import annotations

import dataclasses

from experiments.expressivity.models import STUDY_ARCHITECTURES, ModelFamily
from experiments.expressivity.sweep import DEFAULT_TRAIN, Sweep
from experiments.registry import register_sweep
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.tasks import ARDecodingConfig, MKARConfig, NeedleConfig, SelectiveCopyingConfig

# Mamba-1 blocks (the paper's SSM layers are Mamba). On CPU the per-token scan ("reference")
# trains these tiny models faster than the chunked associative scan.
SSM = dict(ssm_type="mamba1", ssm_options=(("state_size", 8), ("implementation", "reference")))
# The paper's attention layer (its authors' code, as a public reproduction describes it): a
# GPT-NeoX layer with one head and rotary embeddings on a quarter of the head's channels (the
# GPT-NeoX default), windowed to 20 tokens for selective copying and full for MKAR. The
# partial rotation is what makes position hard for a pure transformer (with two heads too): at
# d_model 8 it leaves one rotary pair turning 1 rad per token, which aliases offsets 2π apart
# within the window. With RoPE on every channel of two heads a 2-layer transformer solves
# selective copying (0.957 / 0.980 at 2k / 6k: experiments/README.md, "What makes a pure
# transformer fail").
PAPER_ATTENTION = dict(num_heads=1, rope_fraction=0.25)
# One family for the selective-copying sweeps: they train and evaluate the same cells.
COPY_FAMILY = ModelFamily(window=20, **PAPER_ATTENTION, **SSM)
LEARNING_RATES = (3e-3, 1e-2)
PAPER_NOTE = ("the paper's figures, as the issue and a public reproduction of the authors' "
              "code quote them (experiments/README.md).")
# The selective-copying and MKAR sweeps add a one-layer transformer, a depth ablation: it
# cannot chain "find the last number" and "copy from d back" in one attention step.
WITH_ONE_LAYER = STUDY_ARCHITECTURES + ("transformer-1layer",)


@register_sweep("expressivity/selective-copying")
def selective_copying() -> Sweep:
    return Sweep(
        name="expressivity/selective-copying", data=SelectiveCopyingConfig(),
        description="Selective copying (distances 5..10, number probability 0.2, length 100): "
                    "pure sliding-window transformer, pure SSM and both hybrids at small "
                    "parameter budgets.",
        architectures=WITH_ONE_LAYER,
        family=COPY_FAMILY, budgets=(2000, 6000),
        learning_rates=LEARNING_RATES,
        paper=((2000, (("ssm-attention", 0.999), ("transformer", 0.352), ("ssm", 0.305))),
               (6000, (("ssm-attention", 1.000), ("transformer", 0.727), ("ssm", 0.485))),
               (12000, (("transformer", 0.923), ("ssm", 0.931)))),
        paper_note=PAPER_NOTE)


@register_sweep("expressivity/mkar")
def mkar() -> Sweep:
    return Sweep(
        name="expressivity/mkar", data=MKARConfig(),
        description="Multi-key associative recall (vocabulary 8, keys of 2 tokens, length 100; "
                    "every position whose key occurred before is scored).",
        architectures=WITH_ONE_LAYER,
        family=ModelFamily(window=None, **PAPER_ATTENTION, **SSM), budgets=(6000,),
        learning_rates=LEARNING_RATES, train=dataclasses.replace(DEFAULT_TRAIN, steps=1500),
        paper=((6000, (("ssm-attention", 0.990), ("transformer", 0.230), ("ssm", 0.356),
                       ("attention-ssm", 0.286))),),
        paper_note=PAPER_NOTE)


@register_sweep("expressivity/mkar-length-generalisation")
def mkar_length_generalisation() -> Sweep:
    return dataclasses.replace(
        mkar(), name="expressivity/mkar-length-generalisation",
        description="MKAR trained at length 100, evaluated at 200 and 400 (full attention: "
                    "positions beyond the training length are new to it).",
        eval_variants=(("length 200", (("seq_len", 200),)), ("length 400", (("seq_len", 400),))))


@register_sweep("expressivity/ar-decoding")
def ar_decoding() -> Sweep:
    return Sweep(
        name="expressivity/ar-decoding", data=ARDecodingConfig(),
        description="Associative recall with decoding (32 words, 5-bit query code, length 100).",
        family=ModelFamily(window=None, **SSM), budgets=(2000, 6000),
        learning_rates=LEARNING_RATES)


@register_sweep("expressivity/mqar")
def mqar() -> Sweep:
    return Sweep(
        name="expressivity/mqar", data=MQARConfig(vocab_size=64, seq_len=64, num_kv_pairs=4),
        description="MQAR (zoology generator; vocabulary 64, length 64, 4 key-value pairs).",
        family=ModelFamily(window=None, **SSM), budgets=(2000, 6000),
        learning_rates=LEARNING_RATES)


@register_sweep("expressivity/needle")
def needle() -> Sweep:
    return Sweep(
        name="expressivity/needle", data=NeedleConfig(),
        description="Needle in a haystack (length 100, uniform depth), evaluated at depths "
                    "near the start and the end and at length 200.",
        family=ModelFamily(window=None, **SSM), budgets=(2000, 6000),
        learning_rates=LEARNING_RATES,
        eval_variants=(("depth 0-0.1", (("min_depth", 0.0), ("max_depth", 0.1))),
                       ("depth 0.9-1", (("min_depth", 0.9), ("max_depth", 1.0))),
                       ("length 200", (("seq_len", 200),))))


@register_sweep("expressivity/length-generalisation")
def length_generalisation() -> Sweep:
    return Sweep(
        name="expressivity/length-generalisation", data=SelectiveCopyingConfig(),
        description="Selective copying trained at length 100, evaluated at 200 and 400.",
        architectures=WITH_ONE_LAYER,
        family=COPY_FAMILY, budgets=(6000,),
        learning_rates=LEARNING_RATES,
        eval_variants=(("length 200", (("seq_len", 200),)),
                       ("length 400", (("seq_len", 400),))))


@register_sweep("expressivity/ood")
def ood() -> Sweep:
    return Sweep(
        name="expressivity/ood", data=SelectiveCopyingConfig(),
        description="Selective copying trained with number probability 0.2, evaluated with "
                    "sparser (0.1) and denser (0.4) number tokens.",
        architectures=WITH_ONE_LAYER,
        family=COPY_FAMILY, budgets=(6000,),
        learning_rates=LEARNING_RATES,
        eval_variants=(("number prob 0.1", (("number_prob", 0.1),)),
                       ("number prob 0.4", (("number_prob", 0.4),))))
