"""The `hybrid-jax` command: train / eval / generate / list.

    hybrid-jax train NAME [--out DIR] [--set key=value ...]
    hybrid-jax eval RUN_DIR [--set key=value ...] [--step N]
    hybrid-jax generate RUN_DIR --prompt-ids "1 2 3" [--max-new-tokens N] [--temperature T]
    hybrid-jax list
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a named experiment")
    train.add_argument("name", help="experiment name (see `hybrid-jax list`)")
    train.add_argument("--out", type=Path, default=None, help="run directory (default runs/NAME)")
    train.add_argument("--quiet", action="store_true", help="no progress output")
    _add_overrides(train)

    evaluate = sub.add_parser("eval", help="evaluate a trained run on its held-out data")
    evaluate.add_argument("run_dir", type=Path)
    evaluate.add_argument("--step", type=int, default=None, help="checkpoint step (default latest)")
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
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    from experiments.run import run_experiment

    results = run_experiment(args.name, out_dir=args.out, overrides=args.overrides,
                             progress=not args.quiet)
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
    from hybrid_jax.data.pipeline import eval_batches
    from hybrid_jax.train.trainer import evaluate

    experiment, ts = _load_run(args.run_dir, args.overrides, args.step)
    cfg = experiment.train
    metrics = evaluate(ts, eval_batches(experiment.data, batch_size=cfg.batch_size,
                                        num_batches=cfg.eval_batches, seed=cfg.seed))
    print(json.dumps(metrics))
    print(f"accuracy {metrics['accuracy']:.4f}")
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
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "generate": cmd_generate, "list": cmd_list}


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
