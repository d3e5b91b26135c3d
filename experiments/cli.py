"""The `hybrid-jax` command: train, eval, generate, import, export, convert, scale and tools.

    hybrid-jax train NAME [--out DIR] [--resume] [--set key=value ...]
    hybrid-jax eval RUN_DIR [--set key=value ...] [--step N] [--batches N] [--modes SCHEDULE]
                   [--windows 0,4,16,full [--layers I,...] [--sweep-out DIR]]
    hybrid-jax generate RUN_DIR (--prompt TEXT ... | --prompt-file F | --prompt-ids "1 2 3")
                       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
                       [--stop S ...] [--seed N] [--modes SCHEDULE | --speculative K]
    hybrid-jax import hf HF_DIR --out RUN_DIR [--dtype float32|bfloat16] [--fsdp N]
    hybrid-jax export hf RUN_DIR --out HF_DIR
    hybrid-jax convert RUN_DIR --to nha|oryx --out NEW_RUN_DIR [--window W] [--slots M]
                       [--layers I,J]
    hybrid-jax list
    hybrid-jax tokenizer train FILE_OR_GLOB ... --vocab-size N --out PATH [--force]
    hybrid-jax plot RUN_DIR [RUN_DIR ...] --out curves.png
    hybrid-jax inspect mixing RUN_DIR [--out mixing.png]
    hybrid-jax scale NAME --devices 1,2,4,8 --strategy data,fsdp,tensor,seq [--weak|--strong]
                     [--model PRESET,...] [--time-limit S]

Before the command, `--log-level debug|info|warning|error` (or HYBRID_JAX_LOG_LEVEL) sets what
the library's loggers ("hybrid_jax.*": which kernel rung ran and why, checkpoint and data
warnings) print on stderr; default info, on process 0 of a multi-process run (warning on the
others).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import functools
import gc
import json
import logging
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.help_text import first_paragraph

# Errors that describe bad input or a failed run (configs, names, paths, damaged checkpoints,
# non-finite losses, I/O such as a full disk): one line, no traceback. Anything else is a bug,
# also reported on one line. HYBRID_JAX_DEBUG=1 shows the traceback.
USER_ERRORS = (ValueError, OSError, FloatingPointError)
DEBUG_ENV = "HYBRID_JAX_DEBUG"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ENV = "HYBRID_JAX_LOG_LEVEL"


class _StderrHandler(logging.StreamHandler):
    """The command's handler of the "hybrid_jax" loggers: one line a record on stderr."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))


@contextlib.contextmanager
def logging_to_stderr(level: str = "info"):
    """Within: the "hybrid_jax" loggers print records of `level` and above on stderr, e.g.
    "hybrid_jax.dispatch INFO: ...". Only the command does this: importing the library
    configures no logging. The records do not also propagate to the root logger, whose handler
    (absl's basicConfig, installed when orbax loads) would print each a second time. A nested
    call keeps the one handler and sets its level; on leaving, the logger is as it was."""
    logger = logging.getLogger("hybrid_jax")
    saved = logger.level, logger.propagate
    ours = not any(isinstance(h, _StderrHandler) for h in logger.handlers)
    handler = _StderrHandler() if ours else None
    if handler is not None:
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    try:
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _log_level(args: argparse.Namespace) -> str | None:
    """The level asked for by --log-level, else HYBRID_JAX_LOG_LEVEL; None: neither."""
    return args.log_level if args.log_level is not None else _env_log_level()


def _env_log_level() -> str | None:
    """The level HYBRID_JAX_LOG_LEVEL asks for; None: unset or empty."""
    text = os.environ.get(LOG_LEVEL_ENV, "").strip().lower()
    if text and text not in LOG_LEVELS:
        raise ValueError(f"{LOG_LEVEL_ENV}={os.environ[LOG_LEVEL_ENV]!r}: expected one of "
                         f"{', '.join(LOG_LEVELS)}")
    return text or None


def run_with_logging(main: Callable[[], Any]) -> Any:
    """Runs a benchmark or experiment script's `main` as the command runs its own: the
    "hybrid_jax" loggers print at HYBRID_JAX_LOG_LEVEL (default info) on stderr, so a table
    measured on a fallback rung says so. A bad level: one line, exit 2, before `main` starts."""
    try:
        level = _env_log_level() or "info"
    except ValueError as e:
        print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    with logging_to_stderr(level):
        return main()


def _add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help=f"override a config field, e.g. {example}")


def _add_distributed(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multi-process (see hybrid_jax.distributed; the "
                                      "HYBRID_JAX_* environment variables work too)")
    group.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="address of process 0")
    group.add_argument("--num-processes", type=int, default=None)
    group.add_argument("--process-id", type=int, default=None)
    group.add_argument("--local-device-ids", default=None, metavar="I,I,...",
                       help="this process's devices (default: all of the host's)")
    group.add_argument("--distributed-auto", action="store_true",
                       help="let JAX detect the cluster (SLURM, MPI, TPU pods, ...)")


def _initialize_distributed(args: argparse.Namespace) -> None:
    from hybrid_jax.distributed import initialize, is_main_process

    ids = (None if args.local_device_ids is None
           else [_int_arg("--local-device-ids", i) for i in args.local_device_ids.split(",")])
    if (initialize(args.coordinator, args.num_processes, args.process_id, ids,
                   auto=args.distributed_auto)
            and args.log_level is None and not is_main_process()):
        # By default, INFO (which rung ran) once, from process 0; warnings from every process.
        logging.getLogger("hybrid_jax").setLevel(logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid-jax", description=first_paragraph(__doc__))
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help="what the hybrid_jax loggers (which kernel rung ran and why, "
                             f"warnings) print on stderr (default: ${LOG_LEVEL_ENV}, else info; "
                             "warning on the processes other than 0 of a multi-process run)")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a named experiment")
    train.add_argument("name", help="experiment name (see `hybrid-jax list`)")
    train.add_argument("--out", type=Path, default=None, help="run directory (default runs/NAME)")
    train.add_argument("--quiet", action="store_true", help="no progress output")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its latest checkpoint (its "
                            "config.json, plus --set overrides); starts fresh if it has none")
    train.add_argument("--force", action="store_true",
                       help="start afresh in --out even if it holds another run (its "
                            "checkpoints, metrics and config are deleted)")
    _add_overrides(train, "train.steps=100, model.window=16 or model=pha-tiny")
    _add_distributed(train)

    evaluate = sub.add_parser("eval", help="evaluate a trained run on its held-out data")
    evaluate.add_argument("run_dir", type=Path)
    _add_step(evaluate)
    evaluate.add_argument("--batches", type=int, default=None,
                          help="eval batches (default train.eval_batches; 0, or more than "
                               "there are: all, a synthetic task's in whole batches)")
    evaluate.add_argument("--windows", default=None, metavar="W,W,...",
                          help="evaluate at each attention window, e.g. 0,4,16,full: a table and "
                               "a plot (experiments/window_sweep.py)")
    evaluate.add_argument("--layers", default=None, metavar="I,I,...",
                          help="with --windows: the layers to change (default: all windowed)")
    evaluate.add_argument("--sweep-out", type=Path, default=None,
                          help="with --windows: output folder (default RUN_DIR/window_sweep)")
    evaluate.add_argument("--modes", default=None, metavar="SCHEDULE",
                          help="Oryx modes: linear, attention or scored=attention,other=linear "
                               "(attention on the positions whose next token is scored); "
                               "default: the blocks' default_mode, not train.mode_schedule "
                               "(which the run's logged evals used)")
    _add_overrides(evaluate, "model.window=16 or data.eval_path=valid.txt")

    gen = sub.add_parser("generate", help="continue prompts with a run's model")
    gen.add_argument("run_dir", type=Path)
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    prompt.add_argument("--prompt-file", type=Path,
                        help="a UTF-8 file with one prompt per line")
    prompt.add_argument("--prompt-ids", help="prompt token ids separated by spaces or commas")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--stop", action="append", default=[],
                     help="stop string (repeatable); \\n, \\t, \\r and \\\\ in it are read as "
                          "escapes, so --stop \"\\n\\n\" stops at a blank line")
    gen.add_argument("--no-stream", action="store_true", help="print texts only at the end")
    gen.add_argument("--seed", type=int, default=0)
    _add_step(gen)
    gen.add_argument("--modes", default=None, metavar="SCHEDULE",
                     help="Oryx modes: linear, attention or prefill=linear,decode=attention")
    gen.add_argument("--speculative", type=int, default=None, metavar="K",
                     help="Oryx self-speculative decoding (greedy): K linear-mode drafts per "
                          "attention-mode verification; the tokens of attention-mode decoding")
    _add_overrides(gen, "model.window=16")

    imp = sub.add_parser("import", help="import a pretrained model as a run directory")
    imp.add_argument("format", choices=("hf",), help="hf: a Hugging Face Llama/Qwen2/Mistral "
                     "directory (config.json, *.safetensors, tokenizer.json)")
    imp.add_argument("source", type=Path)
    imp.add_argument("--out", type=Path, required=True, help="the run directory to write")
    imp.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    imp.add_argument("--fsdp", type=int, default=1,
                     help="shard the parameters over this many devices as they are read (-1: "
                          "all of them)")
    imp.add_argument("--scan-layers", action="store_true",
                     help="stack the layers (nnx.scan: fast compiles for eval and fine-tuning)")

    exp = sub.add_parser("export", help="export a run's model in a pretrained-model layout")
    exp.add_argument("format", choices=("hf",))
    exp.add_argument("run_dir", type=Path)
    exp.add_argument("--out", type=Path, required=True, help="the directory to write")
    _add_step(exp)

    conv = sub.add_parser("convert", help="convert a run's transformer into a hybrid")
    conv.add_argument("run_dir", type=Path)
    conv.add_argument("--to", required=True, choices=("nha", "oryx"),
                      help="nha, or oryx (Mamba-2 linear mode; takes no --window/--slots)")
    conv.add_argument("--out", type=Path, required=True, help="the new run directory")
    conv.add_argument("--window", default=None,
                      help="NHA window W of every converted layer, or 'full' (default: a "
                           "layer's own sliding window, else 512)")
    conv.add_argument("--slots", type=int, default=None,
                      help="NHA slots M per kv head (default 64)")
    conv.add_argument("--layers", default=None, metavar="I,J,...",
                      help="the attention layers to convert (default: all)")
    conv.add_argument("--seed", type=int, default=0, help="seed of the new parameters")
    _add_step(conv)
    conv.add_argument("--scan-layers", action="store_true",
                      help="stack the new run's layers (nnx.scan: fast compiles)")

    sub.add_parser("list", help="list presets, block types and experiments")

    tokenizer = sub.add_parser("tokenizer", help="tokenizer tools")
    tokenizer_sub = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    tok_train = tokenizer_sub.add_parser(
        "train", help="train a byte-level BPE (or word vocabulary) on text files")
    tok_train.add_argument("files", nargs="+", help="text / .gz / .xz / ArrayRecord files or globs")
    tok_train.add_argument("--vocab-size", type=int, default=None,
                           help="bpe: default 8192; word: the most frequent words (default all)")
    tok_train.add_argument("--kind", choices=("bpe", "word"), default="bpe")
    tok_train.add_argument("--encoding", default="utf-8", help="of the text files")
    tok_train.add_argument("--out", type=Path, required=True,
                           help="tokenizer.json path, or a (run) directory to write it into")
    tok_train.add_argument("--force", action="store_true",
                           help="replace a tokenizer file already at --out")

    scale = sub.add_parser("scale", help="timed train / forward steps per mesh strategy and "
                                         "device count: a scaling table and plot")
    scale.add_argument("name", help="experiment name (see `hybrid-jax list`)")
    scale.add_argument("--devices", default="1,2,4,8", help="device counts, e.g. 1,2,4,8")
    scale.add_argument("--strategy", default="data", help="comma-separated: data,fsdp,tensor,seq")
    mode = scale.add_mutually_exclusive_group()
    mode.add_argument("--weak", action="store_true",
                      help="work grows with the devices (batch; sequence length for seq)")
    mode.add_argument("--strong", action="store_true", help="fixed global work (the default)")
    scale.add_argument("--steps", type=int, default=5, help="timed steps per setting")
    scale.add_argument("--model", default="", help="comma-separated model presets, each run in "
                       "place of the experiment's model (a row group each)")
    scale.add_argument("--time-limit", type=float, default=None,
                       help="seconds; settings not started by then are skipped (and printed)")
    scale.add_argument("--out", type=Path, default=None, help="output folder (default "
                       "runs/scale-NAME)")
    _add_overrides(scale, "train.batch_size=16 or model.remat=full")

    plot = sub.add_parser("plot", help="loss / perplexity curves of runs on one PNG")
    plot.add_argument("run_dirs", nargs="+", type=Path)
    plot.add_argument("--out", type=Path, default=Path("curves.png"))
    plot.add_argument("--log-y", action="store_true", help="log scale for every panel")

    inspect = sub.add_parser("inspect", help="inspect a trained run")
    inspect.add_argument("what", choices=["mixing"],
                         help="mixing: the learned branch weights of parallel blocks per layer")
    inspect.add_argument("run_dir", type=Path)
    inspect.add_argument("--out", type=Path, default=None,
                         help="heat-map PNG (default RUN_DIR/mixing.png)")
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    from experiments import registry
    from experiments.run import run_experiment

    if args.name in registry.sweep_names():  # `list` shows both: "unknown experiment" misled
        raise ValueError(f"{args.name!r} is a sweep (a grid of runs), not an experiment: run it "
                         f"with `python -m experiments.run {args.name} --out DIR`")
    _initialize_distributed(args)  # before anything touches a device

    out = Path("runs") / args.name if args.out is None else args.out
    results = run_experiment(args.name, out_dir=out, overrides=args.overrides,
                             progress=not args.quiet, resume=args.resume, force=args.force)
    if results.get("interrupted"):
        print(f"{results['interrupted']} at step {results['step']}: checkpoint saved in {out}; "
              f"continue with: hybrid-jax train {args.name} --out {out} --resume")
        return 128 + signal.Signals[results["interrupted"]].value
    print(f"accuracy {results['accuracy']:.4f}")
    return 0


def _at_least(value: int | float | None, low: float, option: str) -> None:
    if value is not None and not (value >= low and math.isfinite(value)):
        raise ValueError(f"{option}={value}: expected a finite value >= {low}")


def _read_run(run_dir: Path, overrides: Sequence[str]):
    """The experiment of a run directory, with `overrides`."""
    from experiments.run import read_experiment
    from hybrid_jax.config import apply_overrides

    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: is {run_dir} a run directory?")
    return apply_overrides(read_experiment(config_path), overrides)


def _run_rules(experiment) -> contextlib.AbstractContextManager:
    """Within: the run's logical-axis rules (`train.mesh.axis_rules` and overrides) lay out its
    parameters as they load and its activations, as in training."""
    from hybrid_jax.sharding import axis_rules, use_rules

    return use_rules(axis_rules(experiment.train.mesh))


def _add_step(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default latest)")


def _load_run(run_dir: Path, experiment, step: int | None, command: str):
    """The train state of checkpoint `step` (default latest) of a run of `experiment`; says on
    stderr which step it uses. Returns (train state, step)."""
    from hybrid_jax.sharding import make_mesh
    from hybrid_jax.train.trainer import changed_model_settings, restore_train_state

    _at_least(step, 0, "--step")
    ts, meta = restore_train_state(experiment, run_dir, make_mesh(experiment.train.mesh),
                                   step=step)
    print(f"{command}: checkpoint step {meta['step']} of {run_dir}", file=sys.stderr)
    changed = changed_model_settings(meta.get("config"), experiment)
    if changed:  # a resume changed them since, or --set: either way, not silently
        verb = "differs" if len(changed) == 1 else "differ"
        print(f"{command}: note: {', '.join(changed)} {verb} from what step {meta['step']} was "
              "trained with (the run's config.json and --set are used)", file=sys.stderr)
    return ts, int(meta["step"])


@contextlib.contextmanager
def load_for_eval(run_dir: Path, overrides: Sequence[str], step: int | None,
                  batches: int | None, command: str):
    """(train state of checkpoint `step` (default latest), its step, held-out batches, their
    word count) of a run; `batches`: default the run's `train.eval_batches`, 0: all. Within,
    the run's axis rules (`train.mesh`) lay out the batches and activations, as in training."""
    from hybrid_jax.sharding import check_batch_split, check_seq_split, make_mesh
    from hybrid_jax.train.trainer import bind_data, held_out_set

    _at_least(batches, 0, "--batches")
    experiment = _read_run(run_dir, overrides)
    cfg, mesh = experiment.train, make_mesh(experiment.train.mesh)
    with _run_rules(experiment):
        check_batch_split(mesh, cfg.batch_size)  # before the checkpoint loads
        check_seq_split(mesh, int(getattr(experiment.data, "seq_len", 0)))
        ts, step = _load_run(run_dir, experiment, step, command)
        data = bind_data(experiment.data, run_dir, resume=True)
        held_out, words = held_out_set(data, cfg.batch_size,
                                       cfg.eval_batches if batches is None else batches,
                                       cfg.seed)
        yield ts, step, held_out, words


def evaluate_run(run_dir: Path, overrides: Sequence[str] = (), *, step: int | None = None,
                 batches: int | None = None, modes: str | None = None
                 ) -> tuple[dict[str, float], int]:
    """Held-out metrics of checkpoint `step` (default latest) of a run, and that step;
    `modes`: an Oryx mode schedule (`evaluate`). The metrics include the bytes of a decode
    cache for one held-out batch (`cache_bytes`, `cache_kv_bytes`, `cache_state_bytes`)."""
    from hybrid_jax.cache import decode_cache_bytes
    from hybrid_jax.train.trainer import evaluate

    with load_for_eval(run_dir, overrides, step, batches, "eval") as (ts, step, held_out, words):
        metrics = evaluate(ts, held_out, num_words=words, modes=modes)
    batch, length = held_out[0]["inputs"].shape
    return {**metrics, **decode_cache_bytes(ts.model(), batch, length)}, step


def cmd_eval(args: argparse.Namespace) -> int:
    _at_least(args.batches, 0, "--batches")
    # The train.* settings that decide the held-out batches and their layout; the others (the
    # schedule, the optimizer) are training's (train.mode_schedule too: eval takes --modes).
    # data.tokenizer: the run's tokenizer.json holds (its checkpoints were trained with it).
    _refuse_unread(args.overrides, "eval", ("model", "data", "train.batch_size", "train.seed",
                                            "train.mesh", *(("train.eval_batches",)
                                                            if args.batches is None else ())),
                   ignores=("data.tokenizer",))
    _refuse_without("--windows", args.windows, ("--layers", args.layers),
                    ("--sweep-out", args.sweep_out))
    if args.windows is not None and args.modes is not None:
        raise ValueError("--modes and --windows: the window sweep runs the model's own modes; "
                         "give one of them")
    if args.windows is not None:
        from experiments.window_sweep import run

        run(args.run_dir, args.windows, layers_text=args.layers, out=args.sweep_out,
            step=args.step, batches=args.batches, overrides=args.overrides)
        return 0
    metrics, step = evaluate_run(args.run_dir, args.overrides, step=args.step,
                                 batches=args.batches, modes=args.modes)
    from hybrid_jax.train.metrics import json_line

    print(json_line({**metrics, "step": step}), end="")  # strict JSON, as metrics.jsonl
    shown = ("loss", "perplexity", "bits_per_byte", "word_perplexity", "accuracy",
             "attention_fraction")
    print(" ".join(f"{k} {metrics[k]:.4f}" for k in shown if k in metrics))
    _print_cache(metrics, "one held-out batch")
    return 0


def _refuse_unread(overrides: Sequence[str], command: str, reads: Sequence[str],
                   ignores: Sequence[str] = ()) -> None:
    """Refuses `--set` keys that `command` would ignore (or fail on: optimizer settings shape
    the checkpoint's state): those outside the settings `reads`, or inside `ignores` (prefixes:
    "model" covers model.window)."""
    def under(key: str, prefixes: Sequence[str]) -> bool:
        return any(key == p or key.startswith(f"{p}.") for p in prefixes)

    keys = [key.strip() for key, sep, _ in (o.partition("=") for o in overrides) if sep]
    unread = [k for k in keys if not under(k, reads) or under(k, ignores)]
    if unread:
        raise ValueError(f"--set {', '.join(unread)}: {command} would ignore "
                         f"{'it' if len(unread) == 1 else 'them'}; it reads {', '.join(reads)} "
                         f"(and what is under them){''.join(f', not {k}' for k in ignores)}")


def _given(*options: tuple[str, object]) -> str:
    """"--a and --b": the flags of `(flag, value)` pairs given (value not None), or ""."""
    return " and ".join(flag for flag, value in options if value is not None)


def _refuse_without(needed: str, value, *options: tuple[str, object]) -> None:
    """Refuses options that take effect only with `needed` when it is not given (they would
    be ignored)."""
    given = _given(*options)
    if value is None and given:
        raise ValueError(f"{given} only apply with {needed}")


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None:
        return args.prompt
    try:  # utf-8-sig: a byte order mark (Notepad, PowerShell) is not text of the first prompt
        lines = args.prompt_file.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompt-file {args.prompt_file}: cannot read it as UTF-8 text "
                         f"({type(e).__name__})") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise ValueError(f"--prompt-file {args.prompt_file} has no non-empty line")
    return prompts


_STOP_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _stop_strings(stops: list[str]) -> list[str]:
    """`--stop` values with the backslash escapes \\n, \\t, \\r and \\\\ read: a shell passes
    `--stop "\\n\\n"` as backslash, n, backslash, n, which no generated text contains. Any other
    backslash stays as it is."""
    return [re.sub(r"\\(.)", lambda m: _STOP_ESCAPES.get(m.group(1), m.group(0)), stop)
            for stop in stops]


def _run_tokenizer(run_dir: Path):
    from hybrid_jax.data.text import TOKENIZER_FILE
    from hybrid_jax.data.tokenizer import load_tokenizer

    path = run_dir / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: generating text needs the run's tokenizer "
                                "(use --prompt-ids for a run without one)")
    return load_tokenizer(path)


def _hf_files(run_dir: Path) -> tuple[dict, dict]:
    """An imported run's Hugging Face config.json and generation_config.json ({} if none)."""
    from hybrid_jax.convert.hf import GENERATION_CONFIG, HF_CONFIG

    return tuple(json.loads((run_dir / name).read_text()) if (run_dir / name).is_file() else {}
                 for name in (HF_CONFIG, GENERATION_CONFIG))


def _generation_limits(run_dir: Path, tokenizer) -> tuple[int | None, list[int]]:
    """The model's position limit and end-of-sequence ids of an imported run."""
    hf, gen = _hf_files(run_dir)
    eos = gen.get("eos_token_id", hf.get("eos_token_id"))
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return hf.get("max_position_embeddings"), sorted({tokenizer.eos_id, *eos})


def cmd_generate(args: argparse.Namespace) -> int:
    _at_least(args.max_new_tokens, 1, "--max-new-tokens")
    _at_least(args.temperature, 0.0, "--temperature")
    _at_least(args.top_k, 1, "--top-k")
    _at_least(args.seed, 0, "--seed")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p={args.top_p}: expected a value in (0, 1]")
    _refuse_unread(args.overrides, "generate", ("model", "train.mesh"))  # the run's tokenizer
    experiment = _read_run(args.run_dir, args.overrides)
    vocab = experiment.model.vocab_size
    with _run_rules(experiment):  # the run's layout, and train.mesh.axis_rules not ignored
        return _generate(args, experiment, vocab)


def _generate(args: argparse.Namespace, experiment, vocab: int) -> int:
    """`generate`'s work after the argument checks: the run loaded, tokens or text out."""
    import jax.numpy as jnp
    import numpy as np

    from hybrid_jax.cache import check_token_ids
    from hybrid_jax.generate import generate
    from hybrid_jax.generate_text import generate_text

    if args.top_k is not None and args.top_k > vocab:
        raise ValueError(f"--top-k={args.top_k}: expected at most the vocabulary size {vocab}")
    truncation = _given(("--top-k", args.top_k), ("--top-p", args.top_p))
    if truncation and args.temperature == 0:  # greedy decoding would ignore them
        raise ValueError(f"{truncation} only apply when sampling: add --temperature T > 0 "
                         "(0, the default, decodes greedily)")
    if args.prompt_ids is not None:
        if args.stop:  # stop strings match text; this path never decodes any
            raise ValueError("--stop only applies with text prompts (--prompt / --prompt-file), "
                             "not --prompt-ids")
        try:
            prompt = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"--prompt-ids must be integers, got {args.prompt_ids!r}") from None
        if not prompt:
            raise ValueError("--prompt-ids is empty: give at least one token id, e.g. \"5 9 12\"")
        check_token_ids(np.asarray([prompt]), vocab, "prompt token")
        ts, _ = _load_run(args.run_dir, experiment, args.step, "generate")
        stats = {}
        tokens = generate(ts.model().with_scan_layers(False), jnp.asarray([prompt]),
                          args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, modes=args.modes, speculative=args.speculative,
                          stats=stats, max_positions=_hf_files(args.run_dir)[0].get(
                              "max_position_embeddings"))
        print(" ".join(str(int(t)) for t in tokens[0]))
        _print_speculative(stats)
        _print_decode_cache(ts.model(), 1,
                            len(prompt) + args.max_new_tokens + (args.speculative or 0))
        return 0
    prompts = _prompts(args)
    tokenizer = _run_tokenizer(args.run_dir)
    max_positions, eos_ids = _generation_limits(args.run_dir, tokenizer)
    ts, _ = _load_run(args.run_dir, experiment, args.step, "generate")
    stream = len(prompts) == 1 and not args.no_stream
    shown = []

    def show(row: int, text: str) -> None:  # streaming: the prompt once, then each piece
        print(("" if shown else prompts[0]) + text, end="", flush=True)
        shown.append(text)

    result = generate_text(
        ts.model().with_scan_layers(False), tokenizer, prompts, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        stop=_stop_strings(args.stop), eos_ids=eos_ids, max_positions=max_positions,
        on_text=show if stream else None, modes=args.modes, speculative=args.speculative)
    for prompt, text in zip(prompts, result.texts, strict=True):
        print("" if shown else f"{prompt}{text}")
    print(f"{sum(len(t) for t in result.tokens)} tokens in {result.seconds:.2f} s "
          f"({result.tokens_per_second:.1f} tokens/s, compile included)", file=sys.stderr)
    _print_speculative(result.speculative)
    longest = max(len(tokenizer.encode_prompt(p)) for p in prompts)
    _print_decode_cache(ts.model(), len(prompts),
                        longest + args.max_new_tokens + (args.speculative or 0))
    return 0


def _print_decode_cache(model, batch: int, max_len: int) -> None:
    from hybrid_jax.cache import decode_cache_bytes

    _print_cache(decode_cache_bytes(model, batch, max_len), f"{batch} x {max_len} tokens")


def _print_cache(sizes: dict, what: str) -> None:
    print(f"decode cache for {what}: {sizes['cache_bytes'] / 2**20:.2f} MiB "
          f"(KV {sizes['cache_kv_bytes'] / 2**20:.2f} MiB, recurrent states "
          f"{sizes['cache_state_bytes'] / 2**20:.2f} MiB)", file=sys.stderr)


def _print_speculative(stats: dict | None) -> None:
    if stats:
        print(f"speculative: {stats['rounds']} rounds, acceptance rate "
              f"{stats['acceptance_rate']:.3f}, {stats['tokens_per_round']:.2f} tokens per round",
              file=sys.stderr)


def cmd_import(args: argparse.Namespace) -> int:
    import jax

    from hybrid_jax.config import MeshConfig
    from hybrid_jax.convert.hf import import_hf
    from hybrid_jax.sharding import make_mesh

    devices = jax.device_count()  # the mesh's errors name train.mesh.*, which import has not
    if not (args.fsdp == -1 or 1 <= args.fsdp <= devices):
        fake = (f"; on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={args.fsdp} "
                "before starting for that many fake devices" if args.fsdp > devices else "")
        raise ValueError(f"--fsdp={args.fsdp}: expected 1 to {devices} (the devices available), or "
                         f"-1 for all of them{fake}")
    mesh = make_mesh(MeshConfig(data=1, fsdp=args.fsdp))
    experiment, _ = import_hf(args.source, args.out, dtype=args.dtype, mesh=mesh,
                              scan_layers=args.scan_layers)
    print(f"imported {args.source} into {args.out}: "
          f"{len(experiment.model.layers)} layers, d_model {experiment.model.d_model}, "
          f"vocab {experiment.model.vocab_size}, {args.dtype}; fine-tune it with "
          f"`hybrid-jax train {experiment.name} --out {args.out} --resume --set data.path=...`")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from hybrid_jax.convert.hf import export_config, export_hf

    experiment = _read_run(args.run_dir, [])
    export_config(experiment.model, args.run_dir, args.out)  # its refusals, before the load
    with _run_rules(experiment):
        ts, _ = _load_run(args.run_dir, experiment, args.step, "export")
        print(f"wrote {export_hf(ts.model(), args.run_dir, args.out)}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from hybrid_jax.convert import nha, oryx

    nha_options = _given(("--window", args.window), ("--slots", args.slots))
    if args.to == "oryx" and nha_options:
        raise ValueError(f"{nha_options}: NHA options; --to oryx takes none")
    window_text = "512" if args.window is None else args.window
    window = (None if window_text == "full" else
              _int_arg("--window", window_text, "an integer or 'full'"))
    layers = (None if args.layers is None else
              [_int_arg("--layers", x) for x in args.layers.split(",")])
    experiment = _read_run(args.run_dir, [])
    converter = oryx.convert_run if args.to == "oryx" else functools.partial(
        nha.convert_run, window=window, num_slots=64 if args.slots is None else args.slots,
        own_windows=args.window is None)
    with _run_rules(experiment):
        ts, _ = _load_run(args.run_dir, experiment, args.step, "convert")
        converted, _ = converter(experiment, ts.model(), args.run_dir, args.out, layers=layers,
                                 seed=args.seed, scan_layers=args.scan_layers)
    data = " --set data.path=..." if getattr(converted.data, "path", None) == "" else ""
    print(f"converted layers {layers or 'all'} of {args.run_dir} to {args.to} in {args.out}; "
          f"fine-tune it with `hybrid-jax train {converted.name} --out {args.out} --resume{data}`")
    return 0


def _int_arg(flag: str, text: str, expected: str = "integers") -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag} expects {expected}, got {text!r}") from None


@functools.cache
def _param_count(preset: str) -> int:
    """Parameters of a preset, built abstractly (shapes only, no arrays) and, for a deep
    stack of few distinct layers, from stacks of one and two of each (a layer's parameters do
    not depend on its neighbours): tracing 48 layers takes seconds each."""
    from flax import nnx

    from hybrid_jax import presets
    from hybrid_jax.nn.lm import LanguageModel, count_params

    config = presets.get(preset)

    def count(layers) -> int:
        short = config.replace(layers=tuple(layers))
        return count_params(nnx.eval_shape(lambda: LanguageModel(short, rngs=nnx.Rngs(0))))

    specs = list(dict.fromkeys(config.layers))
    if 3 * len(specs) >= len(config.layers):
        return count(config.layers)
    one = {spec: count([spec]) for spec in specs}
    per_layer = {spec: count([spec, spec]) - one[spec] for spec in specs}
    outside = one[specs[0]] - per_layer[specs[0]]  # embeddings, final norm, head
    return outside + sum(per_layer[spec] for spec in config.layers)


def cmd_list(args: argparse.Namespace) -> int:
    import textwrap

    from experiments import registry
    from hybrid_jax import presets
    from hybrid_jax.registry import block_names, block_type

    print("presets:  (name, parameters, description)")
    for name in presets.names():
        count = _param_count(name)
        print(f"  {name:32s} {count / 1e6:8.2f}M  {presets.describe(name)}")
    print("block types:")
    for name in block_names():
        print(f"  {name:32s} {block_type(name).description}")
    # Names longer than the column (lm-wikitext2-baseline-transformer-tiny) widen it: at a
    # fixed width they ran into their descriptions.
    print("experiments:")
    width = max(map(len, registry.names()), default=0)
    for name in registry.names():
        print(f"  {name:{width}s}  {registry.get(name).description}")
    print("sweeps (python -m experiments.run SWEEP --out DIR):")
    width = max(map(len, registry.sweep_names()), default=0)
    for name in registry.sweep_names():
        print(f"  {name:{width}s}  "
              f"{textwrap.shorten(registry.get_sweep(name).description, 64)}")
    return 0


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from hybrid_jax.data.corpus import resolve_files
    from hybrid_jax.data.text import TOKENIZER_FILE, corpus_texts
    from hybrid_jax.data.tokenizer import build_word_vocab, train_bpe
    from hybrid_jax.train.run_dir import run_outputs

    try:
        codecs.lookup(args.encoding)
    except LookupError:
        raise ValueError(f"--encoding={args.encoding!r}: not a known text encoding") from None
    out = args.out / TOKENIZER_FILE if args.out.suffix != ".json" else args.out
    if out.parent.exists() and not out.parent.is_dir():  # the save would fail after training
        raise ValueError(f"--out {args.out}: {out.parent} is a file, not a directory; give a "
                         "directory or a .json path")
    trained = run_outputs(out.parent)
    if trained:  # that run's checkpoints were made with the tokenizer there
        raise ValueError(f"{out.parent} holds a run ({', '.join(trained)}): its "
                         f"{out.name} belongs to that run; choose another --out")
    if out.exists() and not args.force:  # before the training: checked, not lost at its end
        raise ValueError(f"{out} already exists: --force replaces it, or choose another --out")
    files = [f for spec in args.files for f in resolve_files(spec, "files", option="")]
    texts = corpus_texts(files, encoding=args.encoding, option="--encoding")
    if args.kind == "word":
        tokenizer = build_word_vocab(texts, args.vocab_size)
    else:
        tokenizer = train_bpe(texts, 8192 if args.vocab_size is None else args.vocab_size)
    tokenizer.save(out)
    print(f"{args.kind} tokenizer with {tokenizer.vocab_size} tokens written to {out}; use it "
          f"with --set data.tokenizer={out} --set model.vocab_size={tokenizer.vocab_size}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from hybrid_jax.train.plot import plot_runs

    print(f"wrote {plot_runs(args.run_dirs, args.out, log_y=args.log_y)}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from hybrid_jax.train.mixing import format_mixing, mixing_weights, plot_mixing

    found = mixing_weights(args.run_dir)
    print(format_mixing(*found))
    print(f"wrote {plot_mixing(*found, args.out or args.run_dir / 'mixing.png')}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    from experiments import scale

    _at_least(args.steps, 1, "--steps")  # timed steps: none has no median
    _at_least(args.time_limit, 0, "--time-limit")
    devices = [_int_arg("--devices", n) for n in scale.parse_list(args.devices, "devices")]
    if min(devices) < 1:
        raise ValueError(f"--devices: expected positive counts, got {args.devices!r}")
    scale.request_cpu_devices(max(devices))  # fake CPU devices, where no accelerator has them
    strategies = scale.parse_list(args.strategy, "strategy", scale.STRATEGIES)
    from hybrid_jax import presets  # jax loads here, after the device request

    models = scale.parse_list(args.model, "model", presets.names()) if args.model else []
    out = Path("runs") / f"scale-{args.name}" if args.out is None else args.out
    scale.run(args.name, devices, strategies, weak=args.weak, steps=args.steps, out=out,
              overrides=args.overrides, models=models, time_limit=args.time_limit)
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "generate": cmd_generate, "list": cmd_list,
            "tokenizer": cmd_tokenizer, "plot": cmd_plot, "import": cmd_import,
            "export": cmd_export, "convert": cmd_convert, "inspect": cmd_inspect,
            "scale": cmd_scale}


def error_line(error: BaseException) -> str:
    """One line for an error: ours are one line already; others are cut to their first line
    (tensorstore and orbax messages carry long dumps)."""
    if isinstance(error, OSError) and error.strerror and not isinstance(error, FileNotFoundError):
        where = f": {error.filename}" if error.filename else ""
        full = " (disk full)" if error.errno == errno.ENOSPC else ""
        return f"I/O error{full}: {error.strerror}{where}"
    text = str(error).strip()
    if not isinstance(error, USER_ERRORS):
        first = text.splitlines()[0] if text else ""
        return (f"unexpected {type(error).__name__}: {first} (set {DEBUG_ENV}=1 for the "
                "traceback)")
    return " ".join(text.split("\n"))


def _thread_error(hook: threading.ExceptHookArgs, command: str) -> None:
    name = hook.thread.name if hook.thread is not None else "?"
    print(f"hybrid-jax {command}: error in thread {name}: {error_line(hook.exc_value)}",
          file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous_hook = threading.excepthook
    if not os.environ.get(DEBUG_ENV):  # a failing writer thread (e.g. disk full): one line
        threading.excepthook = lambda hook: _thread_error(hook, args.command)
    try:
        args.log_level = _log_level(args)
        with logging_to_stderr(args.log_level or "info"):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"hybrid-jax {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # `hybrid-jax generate ... | head`: the reader left, no error of ours
        _stdout_to_devnull()
        return 128 + signal.SIGPIPE  # as a shell reports a writer that the closed pipe ended
    except Exception as e:
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"hybrid-jax {args.command}: error: {error_line(e)}", file=sys.stderr)
        _collect_quietly()
        return 2
    finally:
        threading.excepthook = previous_hook


def _stdout_to_devnull() -> None:
    """Points stdout's descriptor at /dev/null: the exit's flush of what is still buffered
    would raise BrokenPipeError again ("Exception ignored ... BrokenPipeError")."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError):  # not a file (captured): nothing to flush into the pipe
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fileno)
    os.close(devnull)


def _collect_quietly() -> None:
    """Frees what the failed command left behind (e.g. orbax's abandoned read coroutines)
    without their 'Exception ignored in' echoes of the error already reported."""
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = previous


if __name__ == "__main__":
    sys.exit(main())
