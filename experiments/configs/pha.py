"""The PHA ablation on Project Gutenberg (issue 16, item 6): `lm-gutenberg-pha` and its variants
`-sequential`, `-no-attention`, `-no-gss`, `-attention-only`, and `-sequential-prenorm` (the
serial stack with pre-norm residuals instead of DeepNorm's post-norm).

Same width and depth class (d_model 384, 10 blocks, 6 query heads of 64, 2 key/value heads), same
data (the first four Gutenberg training shards, 28.8 M BPE tokens), same BPE tokenizer (8192,
trained on the first shard), same seed and the same 800 steps of 64 × 1024 tokens (52.4 M tokens
seen, ~1.8 epochs), held-out perplexity on the whole `valid` split. Parameters (tied embeddings of
3.1 M included): pha 29.0 M, pha-sequential 29.0 M, pha-no-attention 25.0 M, pha-no-gss 21.8 M,
attention-only 29.2 M (its SwiGLU width 1920 matches pha). `experiments/pha_ablation.py` runs the
six one after another and writes the table and pha's mixing heat map.

The paths and the tokenizer are options: `--set data.path=... --set data.tokenizer=...`; as
registered, a run trains the 8192 BPE on `data.path` when it starts (the driver passes one
tokenizer.json to all six instead).
"""

from __future__ import annotations

from dataclasses import replace

from experiments.configs.lm import DATA, GUTENBERG
from experiments.registry import register
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, ModelConfig, TrainConfig
from hybrid_jax.presets import PHA_ABLATIONS, attention_only_model, pha_model

# In the driver's order: the baseline and the largest ablation first, should time run out.
VARIANTS = ("pha", "attention-only", "pha-no-attention", "pha-sequential", "pha-no-gss",
            "pha-sequential-prenorm")
VOCAB = 8192
WIDTH, DEPTH, KV_HEADS, ATTENTION_ONLY_FFN = 384, 10, 2, 1920
SHARDS = 4

ABLATION_DATA = replace(GUTENBERG, path=",".join(f"{DATA}/gutenberg/train-{i:02d}.txt.xz"
                                                 for i in range(SHARDS)),
                        tokenizer=f"bpe:{VOCAB}", seq_len=1024)
ABLATION_TRAIN = TrainConfig(steps=800, batch_size=64, learning_rate=2e-3, warmup_steps=80,
                             min_lr_ratio=0.1, weight_decay=0.1, log_every=50, eval_every=0,
                             eval_batches=0, checkpoint_every=0, seed=0)


def experiment_name(variant: str) -> str:
    """`lm-gutenberg-pha`, `lm-gutenberg-pha-sequential`, ..., `lm-gutenberg-pha-attention-only`."""
    suffix = "" if variant == "pha" else "-" + variant.removeprefix("pha-")
    return f"lm-gutenberg-pha{suffix}"


def ablation_model(variant: str, *, tiny: bool = False) -> ModelConfig:
    """The variant's model (bf16, scanned layers); `tiny`: its `-tiny` preset (CPU tests)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown PHA ablation variant {variant!r}; expected one of "
                         f"{list(VARIANTS)}")
    if tiny:
        model = presets.get("pha-tiny" if variant == "pha" else f"{variant}-tiny")
        return model.replace(scan_layers=True)
    if variant == "attention-only":
        model = attention_only_model(WIDTH, DEPTH, ATTENTION_ONLY_FFN, vocab_size=VOCAB,
                                     num_kv_heads=KV_HEADS)
    else:
        options = {} if variant == "pha" else PHA_ABLATIONS[variant.removeprefix("pha-")]
        model = pha_model(WIDTH, DEPTH, vocab_size=VOCAB, num_kv_heads=KV_HEADS, **options)
    return model.replace(dtype="bfloat16", scan_layers=True)


def ablation_experiment(variant: str) -> ExperimentConfig:
    return ExperimentConfig(
        name=experiment_name(variant), model=ablation_model(variant), data=ABLATION_DATA,
        train=ABLATION_TRAIN,
        description=f"PHA ablation on Gutenberg: {variant}, d_model {WIDTH}, {DEPTH} blocks, "
                    f"BPE {VOCAB}, 52M tokens (one GPU)")


for _variant in VARIANTS:
    register(experiment_name(_variant))(lambda variant=_variant: ablation_experiment(variant))
