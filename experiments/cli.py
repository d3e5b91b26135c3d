"""The `hybrid-jax` command: train / eval / generate / list / tokenizer / plot.

    hybrid-jax train NAME [--out DIR] [--resume] [--set key=value ...]
    hybrid-jax eval RUN_DIR [--set key=value ...] [--step N] [--batches N]
                   [--windows 0,4,16,full [--layers I,...] [--sweep-out DIR]]
    hybrid-jax generate RUN_DIR --prompt-ids "1 2 3" [--max-new-tokens N] [--temperature T]
    hybrid-jax list
    hybrid-jax tokenizer train FILE_OR_GLOB ... --vocab-size N --out PATH
    hybrid-jax plot RUN_DIR [RUN_DIR ...] --out curves.png
    hybrid-jax scale NAME --devices 1,2,4,8 --strategy data,fsdp,tensor,seq [--weak|--strong]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# Errors that describe bad input (configs, names, paths): one line, no traceback. Set
# HYBRID_JAX_DEBUG=1 to see the traceback anyway.
USER_ERRORS = (ValueError, FileNotFoundError)


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override a config field, e.g. train.steps=100 or model.window=16")


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
    from hybrid_jax.distributed import initialize

    ids = (None if args.local_device_ids is None
           else [int(i) for i in args.local_device_ids.split(",")])
    initialize(args.coordinator, args.num_processes, args.process_id, ids,
               auto=args.distributed_auto)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a named experiment")
    train.add_argument("name", help="experiment name (see `hybrid-jax list`)")
    train.add_argument("--out", type=Path, default=None, help="run directory (default runs/NAME)")
    train.add_argument("--quiet", action="store_true", help="no progress output")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its latest checkpoint (its "
                            "config.json, plus --set overrides); starts fresh if it has none")
    _add_overrides(train)
    _add_distributed(train)

    evaluate = sub.add_parser("eval", help="evaluate a trained run on its held-out data")
    evaluate.add_argument("run_dir", type=Path)
    evaluate.add_argument("--step", type=int, default=None, help="checkpoint step (default latest)")
    evaluate.add_argument("--batches", type=int, default=None,
                          help="eval batches (default train.eval_batches; 0: the whole held-out "
                               "split)")
    evaluate.add_argument("--windows", default=None, metavar="W,W,...",
                          help="evaluate at each attention window, e.g. 0,4,16,full: a table and "
                               "a plot (experiments/window_sweep.py)")
    evaluate.add_argument("--layers", default=None, metavar="I,I,...",
                          help="with --windows: the layers to change (default: all windowed)")
    evaluate.add_argument("--sweep-out", type=Path, default=None,
                          help="with --windows: output folder (default RUN_DIR/window_sweep)")
    _add_overrides(evaluate)

    gen = sub.add_parser("generate", help="continue a prompt with a trained run's model")
    gen.add_argument("run_dir", type=Path)
    gen.add_argument("--prompt-ids", required=True,
                     help="prompt token ids separated by spaces or commas")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--seed", type=int, default=0)
    _add_overrides(gen)

    sub.add_parser("list", help="list presets, block types and experiments")

    tokenizer = sub.add_parser("tokenizer", help="tokenizer tools")
    tokenizer_sub = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    tok_train = tokenizer_sub.add_parser(
        "train", help="train a byte-level BPE (or word vocabulary) on text files")
    tok_train.add_argument("files", nargs="+", help="text / .gz / .xz / ArrayRecord files or globs")
    tok_train.add_argument("--vocab-size", type=int, default=8192)
    tok_train.add_argument("--kind", choices=("bpe", "word"), default="bpe")
    tok_train.add_argument("--out", type=Path, required=True,
                           help="tokenizer.json path, or a (run) directory to write it into")

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
    scale.add_argument("--out", type=Path, default=None, help="output folder (default "
                       "runs/scale-NAME)")
    _add_overrides(scale)

    plot = sub.add_parser("plot", help="loss / perplexity curves of runs on one PNG")
    plot.add_argument("run_dirs", nargs="+", type=Path)
    plot.add_argument("--out", type=Path, default=Path("curves.png"))
    plot.add_argument("--log-y", action="store_true", help="log scale for every panel")
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    import signal

    from experiments.run import run_experiment

    _initialize_distributed(args)  # before anything touches a device

    out = Path("runs") / args.name if args.out is None else args.out
    results = run_experiment(args.name, out_dir=out, overrides=args.overrides,
                             progress=not args.quiet, resume=args.resume)
    if results.get("interrupted"):
        print(f"{results['interrupted']} at step {results['step']}: checkpoint saved in {out}; "
              f"continue with: hybrid-jax train {args.name} --out {out} --resume")
        return 128 + signal.Signals[results["interrupted"]].value
    print(f"accuracy {results['accuracy']:.4f}")
    return 0


def _load_run(run_dir: Path, overrides: Sequence[str], step: int | None):
    from hybrid_jax.config import ExperimentConfig, apply_overrides, from_dict
    from hybrid_jax.sharding import make_mesh
    from hybrid_jax.train.trainer import restore_train_state

    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: is {run_dir} a run directory?")
    experiment = apply_overrides(from_dict(ExperimentConfig, json.loads(config_path.read_text())),
                                 overrides)
    return experiment, restore_train_state(experiment, run_dir, make_mesh(experiment.train.mesh),
                                           step=step)[0]


def cmd_eval(args: argparse.Namespace) -> int:
    from hybrid_jax.train.trainer import bind_data, evaluate, held_out_set

    if args.windows is not None:
        from experiments.window_sweep import run

        run(args.run_dir, args.windows, layers_text=args.layers, out=args.sweep_out,
            step=args.step, batches=args.batches, overrides=args.overrides)
        return 0
    experiment, ts = _load_run(args.run_dir, args.overrides, args.step)
    cfg = experiment.train
    data = bind_data(experiment.data, args.run_dir, resume=True)
    batches, words = held_out_set(data, cfg.batch_size,
                                  cfg.eval_batches if args.batches is None else args.batches,
                                  cfg.seed)
    metrics = evaluate(ts, batches, num_words=words)
    print(json.dumps(metrics))
    shown = ("loss", "perplexity", "bits_per_byte", "word_perplexity", "accuracy")
    print(" ".join(f"{k} {metrics[k]:.4f}" for k in shown if k in metrics))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    import jax.numpy as jnp

    from hybrid_jax.generate import generate

    try:
        prompt = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be integers, got {args.prompt_ids!r}") from None
    _, ts = _load_run(args.run_dir, args.overrides, None)
    tokens = generate(ts.model(), jnp.asarray([prompt]), args.max_new_tokens,
                      temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(" ".join(str(int(t)) for t in tokens[0]))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import textwrap

    from experiments import registry
    from hybrid_jax import presets
    from hybrid_jax.registry import block_names, block_type

    print("presets:")
    for name in presets.names():
        print(f"  {name:32s} {presets.describe(name)}")
    print("block types:")
    for name in block_names():
        print(f"  {name:32s} {block_type(name).description}")
    print("experiments:")
    for name in registry.names():
        print(f"  {name:32s} {registry.get(name).description}")
    print("sweeps (python -m experiments.run SWEEP --out DIR):")
    for name in registry.sweep_names():
        print(f"  {name:36s} {textwrap.shorten(registry.get_sweep(name).description, 64)}")
    return 0


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from hybrid_jax.data.corpus import resolve_files
    from hybrid_jax.data.text import TOKENIZER_FILE, corpus_texts
    from hybrid_jax.data.tokenizer import build_word_vocab, train_bpe

    files = [f for spec in args.files for f in resolve_files(spec, "files")]
    texts = corpus_texts(files)
    tokenizer = build_word_vocab(texts) if args.kind == "word" else train_bpe(texts,
                                                                              args.vocab_size)
    out = args.out / TOKENIZER_FILE if args.out.suffix != ".json" else args.out
    tokenizer.save(out)
    print(f"{args.kind} tokenizer with {tokenizer.vocab_size} tokens written to {out}; use it "
          f"with --set data.tokenizer={out} --set model.vocab_size={tokenizer.vocab_size}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from hybrid_jax.train.plot import plot_runs

    print(f"wrote {plot_runs(args.run_dirs, args.out, log_y=args.log_y)}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    from experiments import scale

    devices = [int(n) for n in scale.parse_list(args.devices, "devices")]
    if min(devices) < 1:
        raise ValueError(f"--devices: expected positive counts, got {args.devices!r}")
    scale.request_cpu_devices(max(devices))  # fake CPU devices, where no accelerator has them
    strategies = scale.parse_list(args.strategy, "strategy", scale.STRATEGIES)
    out = Path("runs") / f"scale-{args.name}" if args.out is None else args.out
    scale.run(args.name, devices, strategies, weak=args.weak, steps=args.steps, out=out,
              overrides=args.overrides)
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "generate": cmd_generate, "list": cmd_list,
            "tokenizer": cmd_tokenizer, "plot": cmd_plot, "scale": cmd_scale}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except USER_ERRORS as e:
        if os.environ.get("HYBRID_JAX_DEBUG"):
            raise
        print(f"hybrid-jax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
