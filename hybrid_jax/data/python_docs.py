"""A small English corpus that every Python has: the documentation topics of `pydoc_data`.

`python_docs_corpus(directory)` writes them (about 0.5 MB: the language reference's sections,
as `help("assert")` shows them) as `train.txt` and `valid.txt` and returns a `TextConfig` for
them, so notebooks and examples train a byte-level model on real text offline.
"""

from __future__ import annotations

from pathlib import Path

from hybrid_jax.data.text import TextConfig


def python_docs_corpus(directory: str | Path, *, seq_len: int = 128,
                       eval_fraction: float = 0.1) -> TextConfig:
    """Writes the corpus into `directory` (the last `eval_fraction` of it is held out)."""
    import pydoc_data.topics

    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction={eval_fraction}: expected a number in (0, 1)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics))
    split = int((1 - eval_fraction) * len(text))
    train, valid = directory / "train.txt", directory / "valid.txt"
    train.write_text(text[:split], encoding="utf-8")
    valid.write_text(text[split:], encoding="utf-8")
    return TextConfig(path=str(train), eval_path=str(valid), seq_len=seq_len)
