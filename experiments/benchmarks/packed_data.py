"""Packed batches of real text for the throughput benchmarks (inputs, targets, segment ids,
positions), from a token file made once on a machine with the corpus:

    python -m experiments.benchmarks.packed_data TEXT_FILES OUT.npz [--vocab 32768]
        [--document-regex '^ = [^=].* = $']

trains a byte-level BPE on the text (WikiText-2's articles by default regex) and stores the
token stream and its document starts. The GPU machine reads OUT.npz (a few MB), so it needs
neither the corpus nor `tokenizers`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.data.corpus import TokenStream, resolve_files, tokenize_documents
from hybrid_jax.data.packing import PackedWindows
from hybrid_jax.data.text import corpus_texts
from hybrid_jax.data.tokenizer import train_bpe

WIKITEXT_ARTICLE = r"^ = [^=].* = $"


def make_token_file(spec: str, out: str, vocab: int, document_regex: str) -> TokenStream:
    files = resolve_files(spec, "text", option="")
    tokenizer = train_bpe(corpus_texts(files, document_regex), vocab)
    stream = tokenize_documents(files, tokenizer, document_regex=document_regex)
    # uint16 wrapped the ids of a vocabulary past 65536; and savez given a name writes it with
    # ".npz" added, so it writes into the file opened at `out`, the path `--data` names.
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    with open(out, "wb") as f:
        np.savez(f, tokens=np.asarray(stream.tokens, dtype), doc_starts=stream.doc_starts,
                 vocab_size=tokenizer.vocab_size)
    return stream


def check_vocabulary(path: str, vocab_size: int) -> None:
    """Raises ValueError unless the token file's BPE vocabulary fits a model of `vocab_size`
    ids (larger ids reach past the embedding table, whose gather clamps them silently)."""
    have = int(np.load(path)["vocab_size"])
    if have > vocab_size:
        raise ValueError(f"{path}: a vocabulary of {have} ids, more than the models' "
                         f"{vocab_size}; make it with --vocab {vocab_size}")


def packed_batches(path: str, batch: int, length: int, count: int, seed: int = 0,
                   vocab_size: int | None = None) -> list[dict[str, np.ndarray]]:
    """`count` batches of `batch` windows of `length` tokens drawn at random from the stream
    (`vocab_size`: refused unless the file's vocabulary fits, `check_vocabulary`)."""
    if vocab_size is not None:
        check_vocabulary(path, vocab_size)
    data = np.load(path)
    source = PackedWindows(TokenStream(data["tokens"], data["doc_starts"]), length)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        rows = [source[int(i)] for i in rng.integers(0, len(source), batch)]
        batches.append({k: np.stack([r[k] for r in rows]) for k in rows[0]})
    return batches


def document_stats(batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Documents per window and mean document length within windows."""
    ids = np.concatenate([b["segment_ids"] for b in batches])
    docs = np.array([len(np.unique(row)) for row in ids])
    return {"docs_per_row": float(docs.mean()),
            "mean_doc_tokens": float(ids.shape[1] / docs.mean())}


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("text")
    parser.add_argument("out")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--document-regex", default=WIKITEXT_ARTICLE)
    args = parser.parse_args()
    stream = make_token_file(args.text, args.out, args.vocab, args.document_regex)
    print(f"{args.out}: {len(stream)} tokens, {len(stream.doc_starts)} documents "
          f"({Path(args.out).stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    run_with_logging(main)
