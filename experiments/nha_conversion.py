"""lm-gutenberg-nha-conversion: how much held-out perplexity a pretrained transformer converted
to NHA recovers with a short fine-tune, at windows 64 and 512, against the original at full
attention. Self-contained: it first pretrains the transformer it converts.

    python -m experiments.nha_conversion --out /tmp/nha-conversion --results $OUT \\
        [--train '.devdata/gutenberg/train-*.txt.xz'] [--valid .devdata/gutenberg/valid.txt.xz]
        [--tokenizer .devdata/gutenberg/bpe16k.json] [--hf-dir HF_DIR] [--size 40m|tiny]
        [--windows 64,512] [--slots 64] [--no-freeze-mlp] [--budget-s 440]
        [--set train.KEY=VALUE ...] [--pretrain-set KEY=VALUE ...]

Stages, each a `hybrid-jax` command (printed as it runs), so every run directory under --out
can be inspected, evaluated or resumed on its own:

1. `train lm-gutenberg-llama-40m` (a Llama-shaped 40M transformer: RMSNorm, SwiGLU, RoPE, GQA,
   untied embeddings) on the training shards with the given BPE → OUT/pretrain;
   `export hf` → OUT/hf, a Hugging Face directory (config.json, model.safetensors,
   tokenizer.json). With `--hf-dir` (e.g. a downloaded Llama) both are skipped.
2. `import hf --scan-layers` → OUT/original, the path a user with a downloaded checkpoint
   takes (every run here stacks its layers under `nnx.scan`: one layer to compile); where
   `transformers` is installed, its logits on a sample are compared with ours (float32).
3. The original on the whole held-out split at full attention, and with every layer cut to
   each sliding window W (no slots, no fine-tuning: what the slots must beat).
4. For each W: `convert --to nha --window W --slots M --scan-layers` → OUT/nha-wW; held-out
   perplexity before fine-tuning; `train --resume` (MLPs frozen unless --no-freeze-mlp, a
   short cosine schedule) whose final evaluation is the perplexity after.
5. The control: the original imported again (OUT/original-finetuned) and fine-tuned the same
   way at full attention, so the table separates recovery from the extra training itself.

All evaluations cover the same text (the whole --valid file in --size 40m) at seq_len 1024 in
bf16 compute. Writes RESULTS/results.json (after every stage, so a cut run keeps what it did)
and RESULTS/results.md (the table). Time: each training loop has a cap
(`train.time_limit_s`, compiles included; a capped run ends early and says so) and the
fine-tunes share what is left of --budget-s. The estimate for one H200 is in
experiments/README.md ("Converting a pretrained transformer to NHA").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.files import write_atomic

NAME = "lm-gutenberg-nha-conversion"
DEVDATA = Path(".devdata") / "gutenberg"
# A fixed sample for the transformers check (any text works; ids come from the tokenizer).
SAMPLE = ("It was the best of times, it was the worst of times, it was the age of wisdom, it "
          "was the age of foolishness, it was the epoch of belief, it was the epoch of "
          "incredulity, it was the season of Light, it was the season of Darkness.")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The sizes and time caps of one run of the experiment."""

    common: tuple[str, ...]  # overrides of every training and evaluation
    pretrain: tuple[str, ...]  # overrides of lm-gutenberg-llama-40m
    finetune: tuple[str, ...]  # train.* of the fine-tunes
    batch_size: int  # of the fine-tunes and evaluations
    seq_len: int
    dtype: str  # compute dtype of the evaluations and fine-tunes (parameters stay float32)
    eval_batches: int  # 0: the whole held-out split
    pretrain_limit_s: float
    finetune_limit_s: float
    control_limit_s: float  # the cap of the control's fine-tune (attention: fast)
    overhead_s: float  # per fine-tuned run: convert / import, evaluation before, the final one
    budget_s: float
    windows: str
    slots: int


PLANS = {
    # One H200: pretraining ~49M tokens (1500 steps × 32 × 1024), each fine-tune ~4.1M tokens
    # (250 × 16 × 1024) at 3e-4, a third of the pretraining peak.
    "40m": Plan(
        common=(), pretrain=(),
        finetune=("train.steps=250", "train.learning_rate=3e-4", "train.warmup_steps=25",
                  "train.min_lr_ratio=0.1", "train.weight_decay=0.0", "train.log_every=25",
                  "train.checkpoint_every=0"),
        batch_size=16, seq_len=1024, dtype="bfloat16", eval_batches=0, pretrain_limit_s=120,
        finetune_limit_s=80, control_limit_s=40, overhead_s=30, budget_s=440, windows="64,512",
        slots=64),
    # CPU smoke run (tests): two layers of width 32, a few steps of everything, one device.
    "tiny": Plan(
        common=("train.mesh.data=1",),
        pretrain=('model.layers=["attention","attention"]', "model.d_model=32",
                  "model.num_heads=4", "model.num_kv_heads=2", "model.ffn_dim=64",
                  "model.dtype=float32", "train.steps=4", "train.batch_size=4",
                  "train.warmup_steps=1", "train.log_every=1", "train.eval_batches=2"),
        finetune=("train.steps=2", "train.learning_rate=1e-3", "train.warmup_steps=1",
                  "train.log_every=1", "train.checkpoint_every=0"),
        batch_size=4, seq_len=64, dtype="float32", eval_batches=2, pretrain_limit_s=300,
        finetune_limit_s=300, control_limit_s=300, overhead_s=0, budget_s=3600, windows="8,32",
        slots=4),
}
FROZEN_MLP = "train.freeze=/ffn/"
CONTROL = "original-finetuned"


def hybrid_jax(*argv: Any) -> None:
    """Runs one `hybrid-jax` command as a user would type it; its errors propagate."""
    from experiments.cli import COMMANDS, build_parser

    argv = [str(a) for a in argv]
    print("$ hybrid-jax " + " ".join(a if " " not in a else repr(a) for a in argv), flush=True)
    args = build_parser().parse_args(argv)
    COMMANDS[args.command](args)


def sets(overrides: Sequence[str]) -> list[str]:
    return [x for override in overrides for x in ("--set", override)]


def training_summary(run_dir: Path) -> dict[str, Any]:
    """A finished `train` run: its results.json and the median logged tokens/s (the first
    record, which holds the compile, left out)."""
    from hybrid_jax.train.metrics import read_metrics, read_results

    results = read_results(run_dir)
    speeds = [r["tokens_per_s"] for r in read_metrics(run_dir) if "tokens_per_s" in r][1:]
    return {**results, "median_tokens_per_s": statistics.median(speeds) if speeds else None}


def transformers_check(hf_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Loads `hf_dir` in transformers (where installed): its float32 logits on SAMPLE against
    those of the imported run `run_dir`, and its tokenizer's ids against ours."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return {"skipped": f"transformers / torch not installed ({e})"}
    import jax
    import numpy as np

    from experiments.cli import _load_run, _read_run, _run_tokenizer

    ids = _run_tokenizer(run_dir).encode_prompt(SAMPLE)
    check: dict[str, Any] = {"transformers": transformers.__version__, "tokens": len(ids)}
    try:  # a failure to load is the finding, not a crash of the experiment
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        with torch.no_grad():
            reference = model.eval()(torch.tensor([ids])).logits.numpy()
        ts, _ = _load_run(run_dir, _read_run(run_dir, ["model.dtype=float32"]), None, "check")
        with jax.default_matmul_precision("highest"):
            ours = np.asarray(ts.model()(jax.numpy.asarray([ids])))
        check.update(model=type(model).__name__, max_rel_logit_diff=float(
            np.abs(ours - reference).max() / np.abs(reference).max()))
    except Exception as e:
        check["model_error"] = f"{type(e).__name__}: {e}"
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
        check["same_token_ids"] = list(tokenizer(SAMPLE)["input_ids"]) == ids.tolist()
    except Exception as e:
        check["tokenizer_error"] = f"{type(e).__name__}: {e}"
    return check


class Report:
    """results.json (rewritten after every stage) and the results.md table."""

    def __init__(self, directory: Path, settings: dict[str, Any]):
        self.directory, self.start = directory, time.perf_counter()
        self.data: dict[str, Any] = {"experiment": NAME, "settings": settings, "stages": {}}
        directory.mkdir(parents=True, exist_ok=True)

    def stage(self, name: str, value: Any, started: float) -> None:
        self.data[name] = value
        self.data["stages"][name] = round(time.perf_counter() - started, 1)
        self.data["total_s"] = round(time.perf_counter() - self.start, 1)
        write_atomic(self.directory / "results.json", json.dumps(self.data, indent=2))
        print(f"[{self.data['total_s']:.0f} s] {name}: {self.data['stages'][name]} s",
              flush=True)

    def table(self) -> str:
        d = self.data

        def ppl(metrics: dict | None) -> str:
            return f"{metrics['perplexity']:.2f}" if metrics else "–"

        lines = ["| model | window | slots | held-out ppl before fine-tune | after | "
                 "fine-tune tokens | fine-tune s |", "|---|---|---|---|---|---|---|"]
        for row in d.get("original", []):
            name = ("original (full attention)" if row["window"] == "full" else
                    "original, sliding window only")
            lines.append(f"| {name} | {row['window']} | – | {ppl(row)} | – | – | – |")
        keys = [(f"nha-w{w}", "NHA (converted)", w, d["settings"]["slots"])
                for w in d["settings"]["windows"]]
        for key, name, window, slots in [*keys, (CONTROL, "original, fine-tuned the same way",
                                                  "full", "–")]:
            run = d.get(key)
            if run is None:
                continue
            tuned = run.get("finetune") or {}
            after = {"perplexity": tuned["eval_perplexity"]} if tuned else None
            tokens = (tuned["steps"] * d["settings"]["finetune_tokens_per_step"]
                      if tuned else 0)
            capped = " (time cap)" if tuned.get("time_limit_reached") else ""
            lines.append(f"| {name} | {window} | {slots} | {ppl(run['before_finetune'])} | "
                         f"{ppl(after)} | {tokens:,}{capped} | "
                         f"{tuned.get('wall_time_s', 0):.0f} |")
        pretrain = d.get("pretrain")
        if pretrain:
            lines.append(f"\nPretraining: {pretrain['steps']} steps, held-out ppl "
                         f"{pretrain['eval_perplexity']:.2f} before export, "
                         f"{pretrain['median_tokens_per_s'] or 0:,.0f} tokens/s, "
                         f"{pretrain['wall_time_s']:.0f} s"
                         f"{' (time cap)' if pretrain['time_limit_reached'] else ''}.")
        if "transformers" in d:
            lines.append(f"transformers check of the exported directory: {d['transformers']}")
        lines.append(f"Stage seconds: {d['stages']}; total {d.get('total_s')} s.")
        text = "\n".join(lines) + "\n"
        write_atomic(self.directory / "results.md", text)
        return text


def main(argv: Sequence[str] | None = None) -> int:
    import jax

    from experiments.cli import _read_run, evaluate_run
    from experiments.window_sweep import window_sweep
    from hybrid_jax.data.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(prog="python -m experiments.nha_conversion",
                                     description=first_paragraph(__doc__))
    parser.add_argument("--out", type=Path, default=Path("runs") / NAME,
                        help="run directories (checkpoints: hundreds of MB)")
    parser.add_argument("--results", type=Path, default=None,
                        help="where results.json / results.md go (default --out)")
    parser.add_argument("--train", default=str(DEVDATA / "train-*.txt.xz"))
    parser.add_argument("--valid", default=str(DEVDATA / "valid.txt.xz"))
    parser.add_argument("--tokenizer", type=Path, default=DEVDATA / "bpe16k.json",
                        help="BPE for the pretraining (a --hf-dir brings its own)")
    parser.add_argument("--hf-dir", type=Path, default=None,
                        help="convert this Hugging Face model instead of pretraining one")
    parser.add_argument("--size", choices=sorted(PLANS), default="40m")
    parser.add_argument("--windows", default=None,
                        help="NHA windows (default 64,512; '': pretrain, export, import only)")
    parser.add_argument("--slots", type=int, default=None, help="NHA slots (default 64)")
    parser.add_argument("--no-freeze-mlp", action="store_true")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the whole run; the fine-tunes share what is left")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="override of the fine-tunes and evaluations, e.g. train.steps=500")
    parser.add_argument("--pretrain-set", dest="pretrain_overrides", action="append",
                        default=[], help="override of the pretraining run")
    parser.add_argument("--no-transformers-check", action="store_true")
    parser.add_argument("--compile-cache", default=None,
                        help="persistent compilation cache (default OUT/jax_cache; 'none': off)")
    args = parser.parse_args(argv)
    plan = PLANS[args.size]
    windows = parse_windows(plan.windows if args.windows is None else args.windows)
    slots = plan.slots if args.slots is None else args.slots
    if slots < 1:
        raise ValueError(f"--slots: expected an integer >= 1, got {slots}")
    deadline = time.perf_counter() + (args.budget_s or plan.budget_s)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.compile_cache != "none":  # the evaluations before and after a fine-tune compile
        # the same program: the second one reads it from the cache
        jax.config.update("jax_compilation_cache_dir", args.compile_cache or str(out / "jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

    data = [*plan.common, f"data.path={args.train}", f"data.eval_path={args.valid}",
            f"data.seq_len={plan.seq_len}", f"data.cache_dir={(out / 'data_cache').absolute()}"]
    # Evaluations take the fine-tunes' settings too: the schedule does not change them, and
    # `--set train.steps=...` must leave a valid config in both.
    evaluation = [*data, f"model.dtype={plan.dtype}", f"train.batch_size={plan.batch_size}",
                  f"train.eval_batches={plan.eval_batches}", *plan.finetune, *args.overrides]
    finetune = [*evaluation, *([] if args.no_freeze_mlp else [FROZEN_MLP])]
    tokens_per_step = plan.seq_len * int(_read_last(finetune, "train.batch_size"))
    report = Report(args.results or out, {
        "size": args.size, "windows": windows, "slots": slots,
        "freeze_mlp": not args.no_freeze_mlp, "finetune_overrides": finetune,
        "finetune_tokens_per_step": tokens_per_step, "hf_dir": str(args.hf_dir or out / "hf"),
        "device": jax.devices()[0].device_kind})

    hf_dir = args.hf_dir
    if hf_dir is None:
        started = time.perf_counter()
        tokenizer = load_tokenizer(args.tokenizer)
        limit = min(plan.pretrain_limit_s, deadline - time.perf_counter())
        hybrid_jax("train", "lm-gutenberg-llama-40m", "--out", out / "pretrain", "--quiet",
                   *sets([*data, f"data.tokenizer={args.tokenizer.absolute()}",
                          f"model.vocab_size={tokenizer.vocab_size}", *plan.pretrain,
                          *args.pretrain_overrides, f"train.time_limit_s={limit:.0f}"]))
        report.stage("pretrain", training_summary(out / "pretrain"), started)
        started = time.perf_counter()
        hf_dir = out / "hf"
        hybrid_jax("export", "hf", out / "pretrain", "--out", hf_dir)
        report.stage("export", sorted(p.name for p in hf_dir.iterdir()), started)

    started = time.perf_counter()
    original = out / "original"
    hybrid_jax("import", "hf", hf_dir, "--out", original, "--scan-layers")
    report.stage("import", str(original), started)
    if not args.no_transformers_check:
        started = time.perf_counter()
        report.stage("transformers", transformers_check(hf_dir, original), started)
    started = time.perf_counter()
    rows = window_sweep(original, [None, *windows], overrides=evaluation)
    report.stage("original", rows, started)

    # Each converted model, then the original fine-tuned the same way (full attention): the
    # control for what the extra training alone gives.
    # What is left of the budget is shared by weight (the control needs half a window's).
    runs = [(f"nha-w{window}", ("convert", original, "--to", "nha", "--window", window,
                                "--slots", slots, "--scan-layers"), plan.finetune_limit_s, 1.0)
            for window in windows]
    runs += [(CONTROL, ("import", "hf", hf_dir, "--scan-layers"), plan.control_limit_s,
              0.5)] if windows else []
    for i, (key, command, cap, weight) in enumerate(runs):
        started = time.perf_counter()
        run = out / key
        hybrid_jax(*command, "--out", run)
        before, _ = evaluate_run(run, finetune)
        result = {"before_finetune": before}
        later = runs[i + 1:]
        share = weight / (weight + sum(w for *_, w in later))
        limit = min(cap, share * (deadline - time.perf_counter()
                                  - plan.overhead_s * (len(later) + 0.5)))
        if limit < 10:
            result["finetune"] = None
            result["skipped"] = f"out of budget ({limit:.0f} s left for this fine-tune)"
        else:
            hybrid_jax("train", _read_run(run, []).name, "--out", run, "--resume", "--quiet",
                       *sets([*finetune, f"train.time_limit_s={limit:.0f}"]))
            result["finetune"] = training_summary(run)
        report.stage(key, result, started)
    print(report.table(), end="")
    return 0


def parse_windows(text: str) -> list[int]:
    """"64,512" → [64, 512] ('': none); each window ≥ 1 and given once (one run directory
    and one row per window)."""
    items = [w for w in text.replace(" ", "").split(",") if w]
    if not all(w.isdigit() and int(w) >= 1 for w in items):
        raise ValueError(f"--windows: expected integers >= 1 separated by commas, got {text!r}")
    windows = [int(w) for w in items]
    repeated = sorted({w for w in windows if windows.count(w) > 1})
    if repeated:
        raise ValueError(f"--windows: {repeated} given more than once in {text!r}")
    return windows


def _read_last(overrides: Sequence[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in reversed(overrides) if o.startswith(key + "="))


if __name__ == "__main__":
    sys.exit(run_with_logging(main))
