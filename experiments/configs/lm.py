"""Language modelling on real text: WikiText-2 (raw) and Project Gutenberg, from `../shared/data`
next to the project root (not the current directory), or from `HYBRID_JAX_DATA=DIR` (a folder of
the same layout). Without that folder a run stops before training with an error naming the
missing file, the folder and both ways to point elsewhere (`experiments.run._with_data_hint`);
the NHA, Oryx and PHA text experiments read the same folder.

The data paths are options (`--set data.path=... --set data.eval_path=...`), so the same
experiments run on any corpus. Tiny variants use the byte tokenizer and train on a CPU in
minutes; the 125M variants train a 32k byte-level BPE on the training split at the start of the
run (recorded as RUN_DIR/tokenizer.json) and are sized for one GPU; the ~1B ones shard their
parameters and AdamW state over every device (FSDP).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from experiments.registry import register
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, TrainConfig
from hybrid_jax.data.text import TextConfig

# The corpora live next to the project (`<project>/../shared/data`), wherever it is run from;
# `HYBRID_JAX_DATA` points elsewhere (a checkout outside the project's parent, a mounted disk).
DATA = os.environ.get("HYBRID_JAX_DATA") or os.path.normpath(
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
# WikiText articles start with a top-level heading line " = Title = " (sections use " = = ").
WIKITEXT_ARTICLE = r"^ = [^=].* = $"
BPE_VOCAB = 32768

WIKITEXT2_RAW = TextConfig(path=f"{DATA}/wikitext-2-raw/wiki.train.raw",
                           eval_path=f"{DATA}/wikitext-2-raw/wiki.valid.raw",
                           seq_len=256, document_regex=WIKITEXT_ARTICLE, word_perplexity=True)
GUTENBERG = TextConfig(path=f"{DATA}/gutenberg/train-00.txt.xz",
                       eval_path=f"{DATA}/gutenberg/valid.txt.xz", seq_len=256)


def data_origin() -> str:
    """Where `DATA` comes from, for errors about a corpus missing there."""
    return ("HYBRID_JAX_DATA" if os.environ.get("HYBRID_JAX_DATA")
            else "../shared/data next to the project")


def require_files(*paths: str, flag: str = "--data") -> None:
    """A driver's corpus files, checked before it starts any run: a missing one is named with
    the folder the default comes from and how to point elsewhere (without this check a
    driver's worker died with a traceback in the data pipeline)."""
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        origin = data_origin() + ("" if os.environ.get("HYBRID_JAX_DATA")
                                  else ", or HYBRID_JAX_DATA=DIR")
        raise FileNotFoundError(f"{missing[0]} not found: {flag} DIR names the data folder "
                                f"(default {DATA}: {origin})")


TINY_TRAIN = TrainConfig(steps=600, batch_size=16, learning_rate=3e-3, warmup_steps=50,
                         weight_decay=0.1, log_every=25, eval_every=100, eval_batches=8,
                         checkpoint_every=200)
GPU_TRAIN = TrainConfig(steps=5000, batch_size=32, learning_rate=6e-4, warmup_steps=500,
                        weight_decay=0.1, log_every=50, eval_every=500, eval_batches=0,
                        checkpoint_every=1000)


def _tiny_model():
    return presets.get("transformer-tiny").replace(vocab_size=257)  # 256 bytes + end of doc


def _gpu_model():
    return presets.get("transformer-125m").replace(vocab_size=BPE_VOCAB, dtype="bfloat16")


@register("lm-wikitext2-transformer-tiny")
def lm_wikitext2_transformer_tiny() -> ExperimentConfig:
    return ExperimentConfig(
        name="lm-wikitext2-transformer-tiny", model=_tiny_model(), data=WIKITEXT2_RAW,
        train=TINY_TRAIN,
        description="2-layer byte-level transformer on WikiText-2 raw (CPU, a few minutes)")


@register("lm-wikitext2-transformer-125m")
def lm_wikitext2_transformer_125m() -> ExperimentConfig:
    return ExperimentConfig(
        name="lm-wikitext2-transformer-125m", model=_gpu_model(),
        data=replace(WIKITEXT2_RAW, tokenizer=f"bpe:{BPE_VOCAB}", seq_len=1024),
        train=replace(GPU_TRAIN, steps=1000, batch_size=16, eval_every=250),
        description="GPT-2-small shape on WikiText-2 raw with a 32k BPE (one GPU)")


@register("lm-gutenberg-transformer-tiny")
def lm_gutenberg_transformer_tiny() -> ExperimentConfig:
    return ExperimentConfig(
        name="lm-gutenberg-transformer-tiny", model=_tiny_model(), data=GUTENBERG,
        train=TINY_TRAIN,
        description="2-layer byte-level transformer on one Gutenberg shard (CPU)")


@register("lm-gutenberg-transformer-125m")
def lm_gutenberg_transformer_125m() -> ExperimentConfig:
    return ExperimentConfig(
        name="lm-gutenberg-transformer-125m", model=_gpu_model(),
        data=replace(GUTENBERG, path=f"{DATA}/gutenberg/train-*.txt.xz",
                     tokenizer=f"bpe:{BPE_VOCAB}", seq_len=1024),
        train=GPU_TRAIN,
        description="GPT-2-small shape on all Gutenberg shards with a 32k BPE (one GPU)")


@register("lm-gutenberg-llama-40m")
def lm_gutenberg_llama_40m() -> ExperimentConfig:
    return ExperimentConfig(
        name="lm-gutenberg-llama-40m",
        model=presets.get("llama-40m").replace(dtype="bfloat16", scan_layers=True),
        data=replace(GUTENBERG, path=f"{DATA}/gutenberg/train-0[0-3].txt.xz",
                     tokenizer="bpe:16384", seq_len=1024),
        train=replace(GPU_TRAIN, steps=1500, learning_rate=1e-3, warmup_steps=100,
                      eval_every=0, checkpoint_every=0),
        description="Llama-shaped 40M transformer on 4 Gutenberg shards with a 16k BPE (one "
                    "GPU, ~2 min; the pretrained model of experiments/nha_conversion.py)")


def _lm_gutenberg_1b(preset: str) -> ExperimentConfig:
    return ExperimentConfig(
        name=f"lm-gutenberg-{preset}",
        model=presets.get(preset).replace(dtype="bfloat16", scan_layers=True, remat="full"),
        data=replace(GUTENBERG, path=f"{DATA}/gutenberg/train-*.txt.xz", tokenizer="bpe:32000",
                     seq_len=2048),
        train=replace(GPU_TRAIN, learning_rate=3e-4, mesh=MeshConfig(data=1, fsdp=-1)),
        description=f"{preset} on all Gutenberg shards with a 32k BPE, T 2048: parameters and "
                    "AdamW state sharded over every device (FSDP), layer scan, remat full")


for _preset in ("nha-hybrid-1b", "transformer-1b"):
    register(f"lm-gutenberg-{_preset}")(lambda preset=_preset: _lm_gutenberg_1b(preset))
