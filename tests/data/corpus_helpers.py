"""Small generated text corpora and a tiny text experiment, shared by the data and train tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig, TrainConfig
from hybrid_jax.data.text import TextConfig

WORDS = ("the", "cat", "sat", "on", "a", "mat", "héllo", "wörld", "日本", "naïve", "—", "1,000",
         "Ω", "emoji🙂", "tab\tsep", "quote\"s")
ARTICLE = r"^ = [^=].* = $"  # WikiText-style article headings


def make_text(seed: int, documents: int, lines: int = 6) -> str:
    """WikiText-like text: ` = Title = ` headings, then lines of random words (unicode too)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(documents):
        out.append(f" = Article {seed}.{d} = \n")
        for _ in range(int(rng.integers(1, lines + 1))):
            words = rng.choice(WORDS, int(rng.integers(0, 12)))
            out.append(" " + " ".join(words) + " \n")
        out.append(" \n")
    return "".join(out)


def write_corpus(directory: Path, *, train_files: int = 2, documents: int = 20) -> Path:
    """`train-<i>.txt` files and a `valid.txt` under `directory`; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(train_files):
        (directory / f"train-{i}.txt").write_text(make_text(i, documents), encoding="utf-8")
    (directory / "valid.txt").write_text(make_text(99, documents // 2), encoding="utf-8")
    return directory


def tiny_text_experiment(corpus: Path, *, steps: int = 12, **train: object) -> ExperimentConfig:
    """A one-layer, width-16 transformer on `corpus` with byte tokens: compiles in seconds."""
    model = ModelConfig(layers=("attention",), vocab_size=257, d_model=16, num_heads=2,
                        ffn_dim=32)
    data = TextConfig(path=str(corpus / "train-*.txt"), eval_path=str(corpus / "valid.txt"),
                      seq_len=16, document_regex=ARTICLE, word_perplexity=True)
    options = dict(steps=steps, batch_size=4, learning_rate=1e-2, warmup_steps=2, log_every=1,
                   eval_batches=2, checkpoint_every=4, mesh=MeshConfig(data=1))
    options.update(train)
    return ExperimentConfig(name="text-test", model=model, data=data,
                            train=TrainConfig(**options))
