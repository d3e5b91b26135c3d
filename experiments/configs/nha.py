"""NHA experiments: MQAR against same-size GSA and sliding-window baselines, and text.

The MQAR comparison (zoology generator, 8 key-value pairs, length 64): an NHA model with a
16-token window and 16 slots per head against a pure GSA model (`mqar-gsa-tiny`, same
widths: window 0 of the same layer is exactly GSA) and a pure sliding-window (16) transformer
(`mqar-swa-tiny`, 4 kv heads). Keys sit up to ~50 tokens before their query, so a 16-token
window alone cannot recall most of them.

At 8 pairs and vocabulary 256 none of the three leaves the "one of the values in context"
plateau (accuracy ≈ 0.14) within 4000 steps at lr 1e-3 or 3e-3, with or without short convs.
The `mqar4-*` experiments are the comparison of record: 4 pairs, vocabulary 64, 4000 steps at
lr 3e-3, the GSA model being the NHA model with window 0 (the same parameters; `window=0` of the
op is exactly GSA). Results in experiments/README.md.

A trained run sweeps its window at evaluation (`hybrid-jax eval RUN --windows 0,4,16,full`):
the same parameters from a pure recurrence to full attention.
"""

from __future__ import annotations

import dataclasses

from experiments.configs.lm import TINY_TRAIN, WIKITEXT2_RAW
from experiments.configs.mqar import MQAR_TINY, MQAR_TRAIN
from experiments.registry import register
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, ModelConfig
from hybrid_jax.data.mqar import MQARConfig


def _mqar(name: str, model: ModelConfig, description: str) -> ExperimentConfig:
    return ExperimentConfig(name=name, model=model, data=MQAR_TINY, train=MQAR_TRAIN,
                            description=description)


@register("mqar-nha-tiny")
def mqar_nha_tiny() -> ExperimentConfig:
    return _mqar("mqar-nha-tiny", presets.get("nha-tiny"),
                 "2-layer NHA (16 slots, window 16) on MQAR (8 pairs, length 64)")


@register("mqar-nha-hybrid-tiny")
def mqar_nha_hybrid_tiny() -> ExperimentConfig:
    return _mqar("mqar-nha-hybrid-tiny", presets.get("nha-hybrid-tiny"),
                 "NHA (window 16) + NHA with a full window on MQAR (8 pairs, length 64)")


@register("mqar-swa-tiny")
def mqar_swa_tiny() -> ExperimentConfig:
    """The sliding-window baseline of NHA's size: 2 attention layers, window 16, 4 kv heads."""
    model = presets.get("swa-transformer-tiny").replace(num_kv_heads=None)
    return _mqar("mqar-swa-tiny", model,
                 "2-layer sliding-window (16) transformer on MQAR (8 pairs, length 64)")


MQAR4 = MQARConfig(vocab_size=64, seq_len=64, num_kv_pairs=4)
MQAR4_TRAIN = dataclasses.replace(MQAR_TRAIN, steps=4000, eval_every=500)


def _mqar4(name: str, model: ModelConfig, description: str) -> ExperimentConfig:
    return ExperimentConfig(name=name, model=model, data=MQAR4, train=MQAR4_TRAIN,
                            description=description + " on MQAR (4 pairs, vocab 64, 4000 steps)")


@register("mqar4-nha-tiny")
def mqar4_nha_tiny() -> ExperimentConfig:
    return _mqar4("mqar4-nha-tiny", presets.get("nha-tiny"), "2-layer NHA (16 slots, window 16)")


@register("mqar4-gsa-tiny")
def mqar4_gsa_tiny() -> ExperimentConfig:
    return _mqar4("mqar4-gsa-tiny", presets.get("nha-tiny").replace(window=0),
                  "2-layer GSA (the NHA model with window 0)")


@register("mqar4-swa-tiny")
def mqar4_swa_tiny() -> ExperimentConfig:
    return _mqar4("mqar4-swa-tiny", mqar_swa_tiny().model,
                  "2-layer sliding-window (16) transformer")


@register("lm-wikitext2-nha-tiny")
def lm_wikitext2_nha_tiny() -> ExperimentConfig:
    return ExperimentConfig(
        name="lm-wikitext2-nha-tiny", model=presets.get("nha-tiny").replace(vocab_size=257),
        data=WIKITEXT2_RAW, train=TINY_TRAIN,
        description="2-layer byte-level NHA (16 slots, window 16) on WikiText-2 raw (CPU)")
