"""Runs a named experiment: `python -m experiments.run NAME [--out DIR] [--set key=value ...]`.

Same as `hybrid-jax train NAME ...`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import registry
from hybrid_jax.config import apply_overrides


def run_experiment(name: str, *, out_dir: str | Path | None = None,
                   overrides: Sequence[str] = (), progress: bool = True) -> dict[str, Any]:
    """Trains experiment `name` (with `key=value` overrides) into `out_dir` (default runs/NAME)."""
    from hybrid_jax.train import train

    experiment = apply_overrides(registry.get(name), overrides)
    out_dir = Path("runs") / name if out_dir is None else Path(out_dir)
    if progress:
        print(f"{name}: {experiment.description}\nrun directory: {out_dir}", flush=True)
    return train(experiment, out_dir, progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
