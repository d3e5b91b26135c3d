"""The PHA ablation on Gutenberg, end to end (issue 16, item 6): prepare the data here, run the
six `lm-gutenberg-pha*` experiments on one GPU one after another, write the table and the mixing
heat map.

    python -m experiments.pha_ablation prepare [--corpus ../shared/data/gutenberg]
        [--out .devdata/gutenberg] [--shards 4] [--vocab 8192]
    python -m experiments.pha_ablation run --data .devdata/gutenberg --out runs/pha-ablation
        [--variants pha,attention-only,...] [--time-limit 420] [--export DIR] [--tiny]

`prepare` copies the first `--shards` training shards and `valid.txt.xz` to `--out` and trains the
byte-level BPE on the first shard (`tokenizer.json`): what the GPU machine needs, ~30 MB.

`run` trains each variant of `experiments/configs/pha.py` into `OUT/<variant>/` with the data of
`--data` (its shards, its `valid.txt.xz`, its `tokenizer.json`; tokenized once into
`OUT/data_cache`), then writes `OUT/ablation.json` and `OUT/ablation.md` (held-out perplexity,
bits per byte, tokens/s, parameters, wall time) and the pha run's learned mixing
(`hybrid-jax inspect mixing OUT/pha`: printed, and `OUT/mixing.png`). A variant whose
`results.json` exists is not trained again (a second call finishes an interrupted one; one
that ran another configuration, e.g. `--tiny`, is refused); one that
would start after `--time-limit` seconds is skipped (listed as such). `--export DIR` copies the
small outputs (no checkpoints, no token cache) to DIR. `--tiny` runs the variants' `-tiny`
presets for a few steps (the CPU test of this script).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from experiments.cli import run_with_logging
from experiments.configs.lm import DATA
from experiments.configs.pha import VARIANTS, VOCAB, ablation_experiment, ablation_model
from experiments.files import check_same_config
from experiments.help_text import first_paragraph
from hybrid_jax.config import ExperimentConfig
from hybrid_jax.data.text import corpus_texts
from hybrid_jax.data.tokenizer import load_tokenizer, train_bpe
from hybrid_jax.files import write_atomic
from hybrid_jax.train.metrics import read_metrics, read_results
from hybrid_jax.train.trainer import train

TOKENIZER = "tokenizer.json"
VALID = "valid.txt.xz"
COLUMNS = ("variant", "params_M", "eval_perplexity", "eval_bits_per_byte", "eval_loss",
           "train_loss", "tokens_per_s", "tokens_M", "wall_s")


def prepare(corpus: Path, out: Path, *, shards: int, vocab: int) -> dict:
    """Copies `shards` training shards and the valid split to `out`; trains the BPE on the
    first shard. Returns the manifest (also `out/manifest.json`)."""
    if shards < 1:  # the BPE trains on the first shard: none failed as an IndexError
        raise ValueError(f"--shards: expected at least 1, got {shards}")
    files = sorted(corpus.glob("train-*.txt.xz"))[:shards]
    if len(files) < shards or not (corpus / VALID).is_file():
        raise FileNotFoundError(f"{corpus}: expected ≥ {shards} train-*.txt.xz shards and "
                                f"{VALID}, found {[f.name for f in files]}")
    out.mkdir(parents=True, exist_ok=True)
    for path in [*files, corpus / VALID]:
        shutil.copyfile(path, out / path.name)
    tokenizer = train_bpe(corpus_texts(files[:1]), vocab)
    tokenizer.save(out / TOKENIZER)
    manifest = {"corpus": str(corpus), "shards": [f.name for f in files], "vocab": vocab,
                "tokenizer_trained_on": files[0].name,
                "bytes": {p.name: p.stat().st_size for p in sorted(out.iterdir())}}
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2))
    return manifest


def variant_experiment(variant: str, data: Path, out: Path, *, tiny: bool) -> ExperimentConfig:
    """The registered experiment with `data`'s files and tokenizer (tiny: the `-tiny` model, a
    few short steps)."""
    experiment = ablation_experiment(variant)
    tokenizer = load_tokenizer(data / TOKENIZER)
    shards = ",".join(str(p) for p in sorted(data.glob("train-*.txt.xz")))
    data_config = replace(experiment.data, path=shards, eval_path=str(data / VALID),
                          tokenizer=str(data / TOKENIZER), cache_dir=str(out / "data_cache"))
    model, train_config = experiment.model, experiment.train
    if tiny:
        model = ablation_model(variant, tiny=True)
        data_config = replace(data_config, seq_len=32)
        train_config = replace(train_config, steps=4, batch_size=8, warmup_steps=1,
                               log_every=2, eval_batches=2)
    return replace(experiment, model=model.replace(vocab_size=tokenizer.vocab_size),
                   data=data_config, train=train_config)


def tokens_per_s(run_dir: Path) -> float | None:
    """Median training tokens/s over the logged steps after the first (which compiles)."""
    rates = [r["tokens_per_s"] for r in read_metrics(run_dir) if "tokens_per_s" in r][1:]
    return statistics.median(rates) if rates else None


def row(variant: str, run_dir: Path, experiment: ExperimentConfig) -> dict:
    results = read_results(run_dir)
    tokens = experiment.train.steps * experiment.train.batch_size * experiment.data.seq_len
    return {"variant": variant, "experiment": experiment.name,
            "params_M": results["params"] / 1e6,
            **{k: results.get(k) for k in ("eval_perplexity", "eval_bits_per_byte", "eval_loss",
                                           "train_loss")},
            "tokens_per_s": tokens_per_s(run_dir), "tokens_M": tokens / 1e6,
            "wall_s": results.get("wall_time_s")}


def markdown(rows: list[dict]) -> str:
    def cell(value):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        return f"{value:,.3f}" if isinstance(value, float) and abs(value) < 100 else (
            f"{value:,.0f}" if isinstance(value, float) else str(value))

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


RUN_FILES = ("config.json", "metrics.jsonl", "results.json")


def export(out: Path, to: Path) -> None:
    """Copies the table, the heat map and each run's config, metrics and results (not its
    checkpoints or the token cache) from `out` to `to`."""
    to.mkdir(parents=True, exist_ok=True)
    for path in [out / "ablation.json", out / "ablation.md", out / "mixing.png"]:
        if path.is_file():
            shutil.copyfile(path, to / path.name)
    for run_dir in sorted(p for p in out.iterdir() if (p / "results.json").is_file()):
        (to / run_dir.name).mkdir(exist_ok=True)
        for name in RUN_FILES:
            shutil.copyfile(run_dir / name, to / run_dir.name / name)


def check_variants(variants: list[str]) -> None:
    """Each variant known and given once, checked before the first one trains; none (`--variants
    ,`) wrote an empty table."""
    if not variants:
        raise ValueError(f"--variants: expected some of {list(VARIANTS)}, got none")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown {unknown}; expected some of {list(VARIANTS)}")
    repeated = sorted({v for v in variants if variants.count(v) > 1})
    if repeated:
        raise ValueError(f"--variants: {repeated} given more than once in {variants}")


def check_finished(run_dir: Path, experiment: ExperimentConfig) -> None:
    """A finished variant is read instead of trained only if it ran this experiment
    (`check_same_config`): a `--tiny` run's results were reported as the full variant's (its
    tokens_M, its name), or the other way round, and a run on other data as this data's."""
    check_same_config(run_dir, experiment, marker="results.json",
                      hint=f"--tiny or --data? use another --out or remove {run_dir}")


def run(data: Path, out: Path, *, variants: list[str], tiny: bool, time_limit: float) -> list:
    check_variants(variants)
    experiments = {v: variant_experiment(v, data, out, tiny=tiny) for v in variants}
    for variant, experiment in experiments.items():  # before the first one trains
        if (out / variant / "results.json").is_file():
            check_finished(out / variant, experiment)
    start, rows = time.perf_counter(), []
    out.mkdir(parents=True, exist_ok=True)
    for variant, experiment in experiments.items():
        run_dir = out / variant
        if not (run_dir / "results.json").is_file():
            if time.perf_counter() - start > time_limit:
                rows.append({"variant": variant, "experiment": experiment.name,
                             "skipped": f"time limit {time_limit:.0f} s"})
                print(f"{variant}: skipped (time limit)", flush=True)
                continue
            print(f"{variant}: training {experiment.name} ({time.perf_counter() - start:.0f} s "
                  "into the run)", flush=True)
            train(experiment, run_dir, progress=False, force=True)
        rows.append(row(variant, run_dir, experiment))
        print(json.dumps(rows[-1]), flush=True)
    write_atomic(out / "ablation.json", json.dumps({"rows": rows, "tiny": tiny,
                                                    "command": " ".join(sys.argv)}, indent=2))
    write_atomic(out / "ablation.md", markdown(rows))
    print(markdown(rows))
    if (out / "pha" / "results.json").is_file():
        from experiments.cli import main as cli_main

        cli_main(["inspect", "mixing", str(out / "pha"), "--out", str(out / "mixing.png")])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="copy shards and train the BPE (CPU, here)")
    prep.add_argument("--corpus", type=Path, default=Path(DATA) / "gutenberg")
    prep.add_argument("--out", type=Path, default=Path(".devdata/gutenberg"))
    prep.add_argument("--shards", type=int, default=4)
    prep.add_argument("--vocab", type=int, default=VOCAB)
    go = commands.add_parser("run", help="train the variants (default all six), write the table")
    go.add_argument("--data", type=Path, default=Path(".devdata/gutenberg"))
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--variants", default=",".join(VARIANTS))
    go.add_argument("--time-limit", type=float, default=420.0,
                    help="seconds; variants that would start later are skipped")
    go.add_argument("--tiny", action="store_true", help="the -tiny presets, a few steps (CPU)")
    go.add_argument("--export", type=Path, default=None,
                    help="also copy the table, heat map and runs' metrics (no checkpoints) here")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        print(json.dumps(prepare(args.corpus, args.out, shards=args.shards, vocab=args.vocab),
                         indent=2))
        return 0
    run(args.data, args.out, variants=[v for v in args.variants.split(",") if v],
        tiny=args.tiny, time_limit=args.time_limit)
    if args.export is not None:
        export(args.out, args.export)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
