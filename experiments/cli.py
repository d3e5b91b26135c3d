"""The `hybrid-jax` command: train / eval / generate / list / tokenizer / plot.

    hybrid-jax train NAME [--out DIR] [--resume] [--set key=value ...]
    hybrid-jax eval RUN_DIR [--set key=value ...] [--step N] [--batches N]
                   [--windows 0,4,16,full [--layers I,...] [--sweep-out DIR]]
    hybrid-jax generate RUN_DIR --prompt-ids "1 2 3" [--max-new-tokens N] [--temperature T]
    hybrid-jax list
    hybrid-jax tokenizer train FILE_OR_GLOB ... --vocab-size N --out PATH
    hybrid-jax plot RUN_DIR [RUN_DIR ...] --out curves.png
    hybrid-jax inspect mixing RUN_DIR [--out mixing.png]
"""

from __future__ import annotations

import argparse
import functools
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
    import signal

    from experiments.run import run_experiment

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


@functools.cache
def _param_count(preset: str) -> int:
    """Parameters of a preset (built abstractly: shapes only, no arrays)."""
    from flax import nnx

    from hybrid_jax import presets
    from hybrid_jax.nn.lm import LanguageModel, count_params

    config = presets.get(preset)
    return count_params(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))))


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


def cmd_inspect(args: argparse.Namespace) -> int:
    from hybrid_jax.train.mixing import format_mixing, mixing_weights, plot_mixing

    found = mixing_weights(args.run_dir)
    print(format_mixing(*found))
    print(f"wrote {plot_mixing(*found, args.out or args.run_dir / 'mixing.png')}")
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "generate": cmd_generate, "list": cmd_list,
            "tokenizer": cmd_tokenizer, "plot": cmd_plot, "inspect": cmd_inspect}


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
