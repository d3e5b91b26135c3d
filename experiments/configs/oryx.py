"""Oryx experiments: mixed-mode training on tasks the tiny models learn on a CPU.

Every run draws each chunk's mode at random (`train.mode_schedule`, attention with probability
0.5 unless `--set train.mode_schedule.attention_prob=P`), so both modes learn; the evaluation
scripts then run the trained model under fixed schedules (`experiments/oryx_modes.py`):

- `mqar4-oryx-gdn-tiny`: MQAR with 4 pairs, vocabulary 64, length 64 (the `mqar4-*` task NHA
  solves), 16-token chunks; the 4 query tokens are 6.25 % of each sequence.
- `needle-oryx-gdn-tiny`: needle in a haystack of 64 tokens (`hybrid_jax.data.tasks.needle`),
  the scored query token 1.6 % of the sequence; `needle8-oryx-gdn-tiny` the multi-key form,
  8 needles in 64 tokens (one needle is held perfectly by the linear state at any length).
- `lm-wikitext2-oryx-gdn-tiny`: byte-level WikiText-2, 256-token rows in 32-token chunks, for
  the mode-switch curves and speculative decoding (CPU); `lm-wikitext2-oryx-gdn-small` the
  same at d_model 512, 6 layers, for speculative decoding on a GPU
  (`experiments/benchmarks/oryx_speculative.py`).

Each of `mqar4`, `needle` and `lm-wikitext2` also has single-mixer baselines of
oryx-gdn-tiny's width and depth trained on the same data with the same steps and seed,
`<task>-baseline-{transformer,gdn,mamba2}-tiny` (`BASELINES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from experiments.configs.lm import TINY_TRAIN, WIKITEXT2_RAW
from experiments.configs.mqar import MQAR_TINY, MQAR_TRAIN
from experiments.configs.nha import MQAR4
from experiments.registry import register
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, ModelConfig, ModeSchedule, layer
from hybrid_jax.data.tasks.needle import NeedleConfig

MIXED = ModeSchedule(pattern="random_chunks", chunk=16, attention_prob=0.5)


@register("mqar-oryx-gdn-tiny")
def mqar_oryx_gdn_tiny() -> ExperimentConfig:
    """Oryx-GDN on the 8-pair MQAR of `mqar-*-tiny` (800 steps)."""
    train = dataclasses.replace(MQAR_TRAIN, steps=800, mode_schedule=MIXED)
    return ExperimentConfig(name="mqar-oryx-gdn-tiny", model=presets.get("oryx-gdn-tiny"),
                            data=MQAR_TINY, train=train,
                            description="Oryx (attention | GDN per 16-token chunk) on MQAR")


@register("mqar4-oryx-gdn-tiny")
def mqar4_oryx_gdn_tiny() -> ExperimentConfig:
    """1000 steps at a constant 3e-3 after warmup: at attention probability 0.5 the task is
    learned by step ~700 (train accuracy 0.94). With the cosine decay to 0.1x over these 1000
    steps a 0.25 run stayed on the plateau (recall 0.25, CPU, 2026-12-01; experiments/README.md,
    Oryx)."""
    train = dataclasses.replace(MQAR_TRAIN, steps=1000, eval_every=0, eval_batches=4,
                                log_every=100, min_lr_ratio=1.0, mode_schedule=MIXED)
    model = presets.get("oryx-gdn-tiny").replace(vocab_size=MQAR4.vocab_size)
    return ExperimentConfig(name="mqar4-oryx-gdn-tiny", model=model,
                            data=MQAR4, train=train,
                            description="Oryx-GDN, mixed mode, on MQAR (4 pairs, vocab 64)")


def _needle(name: str, data: NeedleConfig, steps: int, description: str) -> ExperimentConfig:
    """oryx-gdn-tiny in mixed mode on `data` at a constant 3e-3 after warmup."""
    train = dataclasses.replace(MQAR_TRAIN, steps=steps, eval_every=0, eval_batches=4,
                                log_every=50, min_lr_ratio=1.0, mode_schedule=MIXED)
    model = presets.get("oryx-gdn-tiny").replace(vocab_size=data.vocab_size)
    return ExperimentConfig(name=name, model=model, data=data, train=train,
                            description=description)


@register("needle-oryx-gdn-tiny")
def needle_oryx_gdn_tiny() -> ExperimentConfig:
    """200 steps: at attention probability 0.5 the needle is found (train accuracy 1) from
    step ~125 (CPU, 2026-12-01)."""
    return _needle("needle-oryx-gdn-tiny", NeedleConfig(seq_len=64), 200,
                   "Oryx-GDN, mixed mode, on a 64-token needle in a haystack")


@register("needle8-oryx-gdn-tiny")
def needle8_oryx_gdn_tiny() -> ExperimentConfig:
    """Multi-key needle in a haystack: 8 needles (16 keys, 16 values) in 64 tokens, one queried;
    600 steps. At attention probability 0.5 it was still on the plateau (loss ln 16) at step
    250 on CPU, where it was stopped: one scored token per row learns slowly; a GPU budget."""
    data = NeedleConfig(num_filler=16, num_keys=16, num_values=16, seq_len=64, num_needles=8)
    return _needle("needle8-oryx-gdn-tiny", data, 600,
                   "Oryx-GDN, mixed mode, on 8 needles in a 64-token haystack")


@register("lm-wikitext2-oryx-gdn-tiny")
def lm_wikitext2_oryx_gdn_tiny() -> ExperimentConfig:
    train = dataclasses.replace(TINY_TRAIN, steps=500, eval_every=0, checkpoint_every=0,
                                mode_schedule=dataclasses.replace(MIXED, chunk=32))
    return ExperimentConfig(
        name="lm-wikitext2-oryx-gdn-tiny",
        model=presets.get("oryx-gdn-tiny").replace(vocab_size=257), data=WIKITEXT2_RAW,
        train=train, description="byte-level Oryx-GDN, mixed mode (32-token chunks), on "
                                 "WikiText-2 raw (CPU)")


@register("lm-wikitext2-oryx-gdn-small")
def lm_wikitext2_oryx_gdn_small() -> ExperimentConfig:
    """~22M parameters, byte-level, 512-token rows in 64-token chunks, bfloat16 (one GPU)."""
    model = presets.get("oryx-gdn-tiny").replace(
        layers=(layer("oryx", chunk_size=64),) * 6, vocab_size=257, d_model=512, num_heads=8,
        dtype="bfloat16")
    train = dataclasses.replace(TINY_TRAIN, steps=400, batch_size=32, learning_rate=2e-3,
                                warmup_steps=40, eval_every=0, checkpoint_every=0,
                                log_every=50, mode_schedule=dataclasses.replace(MIXED, chunk=64))
    return ExperimentConfig(
        name="lm-wikitext2-oryx-gdn-small", model=model,
        data=dataclasses.replace(WIKITEXT2_RAW, seq_len=512), train=train,
        description="byte-level Oryx-GDN (6 x 512), mixed mode, on WikiText-2 raw (GPU)")


def _gdn_baseline() -> ModelConfig:
    """gdn-tiny with oryx-gdn-tiny's value width (expand_v 1): the Oryx model without W_Q^att."""
    config = presets.get("gdn-tiny")
    return config.replace(layers=tuple(
        layer("gdn", **{**dict(spec.options), "expand_v": 1}) for spec in config.layers))


# Single-mixer baselines of oryx-gdn-tiny (0.128M parameters on the needle vocabulary): 2
# attention layers (0.109M), 2 GDN layers (0.120M), 4 Mamba-2 layers without FFN (0.115M).
BASELINES = {"transformer-tiny": lambda: presets.get("transformer-tiny"),
             "gdn-tiny": _gdn_baseline, "mamba2-tiny": lambda: presets.get("mamba2-tiny")}


def _register_baselines(task: str, oryx: Callable[[], ExperimentConfig]) -> None:
    """`<task>-baseline-<preset>` for each of BASELINES: `oryx`'s data, vocabulary and training,
    without a mode schedule."""
    for preset, model in BASELINES.items():
        name = f"{task}-baseline-{preset}"

        def experiment(name=name, preset=preset, model=model) -> ExperimentConfig:
            base = oryx()
            return dataclasses.replace(
                base, name=name, model=model().replace(vocab_size=base.model.vocab_size),
                train=dataclasses.replace(base.train, mode_schedule=ModeSchedule()),
                description=f"{preset}, the single-mixer baseline of {base.name}")

        register(name)(experiment)


for _task, _oryx in (("mqar4", mqar4_oryx_gdn_tiny), ("needle", needle_oryx_gdn_tiny),
                     ("lm-wikitext2", lm_wikitext2_oryx_gdn_tiny)):
    _register_baselines(_task, _oryx)
