"""`python -m experiments.run SWEEP [--out DIR] [--jobs N] [--set key=value ...]`: runs a
registered sweep (resuming it when DIR holds finished cells) and writes its report.

`--set` changes the sweep itself, e.g. `budgets=[1000,2000,6000,12000]`, `seeds=[0,1,2]`,
`train.steps=3000`, `family.ssm_type=mamba2`, `data.seq_len=200`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.help_text import first_paragraph

DEFAULT_JOBS = min(2, os.cpu_count() or 1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.run SWEEP",
                                     description=first_paragraph(__doc__))
    parser.add_argument("name", help="sweep name (see experiments/README.md)")
    parser.add_argument("--out", type=Path, default=None, help="output directory "
                        "(default runs/SWEEP); finished cells there are skipped")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help=f"worker processes (default {DEFAULT_JOBS}; 1: this process)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the report from the finished cells")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a sweep field")
    return parser


def main(argv: Sequence[str]) -> int:
    from experiments import registry
    from experiments.cli import error_line
    from experiments.expressivity.report import write_report
    from experiments.expressivity.sweep import SweepStopped, check_cells, collect, run_sweep
    from hybrid_jax.config import apply_overrides

    args = build_parser().parse_args(argv)
    out = Path("runs") / args.name if args.out is None else args.out
    failed: list[str] = []
    try:
        sweep = apply_overrides(registry.get_sweep(args.name), args.overrides)
        if args.report_only:
            check_cells(sweep, out)
            rows = collect(sweep, out)
            if not rows:  # a mistyped --out reported nothing and succeeded
                raise ValueError(f"--report-only: no finished cell of {args.name} in {out}")
        else:
            rows, failed = run_sweep(sweep, out, jobs=args.jobs)
        if rows:
            paths = write_report(sweep, rows, out)
            print(paths[1].read_text())
            print("wrote " + ", ".join(str(p) for p in paths))
    # Bad overrides, an output directory trained differently, I/O (e.g. --out is a file).
    except (ValueError, OSError) as e:
        print(f"experiments.run {args.name}: error: {error_line(e)}", file=sys.stderr)
        return 2
    except (SweepStopped, KeyboardInterrupt) as e:
        name = e.signal_name if isinstance(e, SweepStopped) else "SIGINT"
        where = f" ({e})" if isinstance(e, SweepStopped) else ""
        print(f"experiments.run {args.name}: interrupted{where}; finished cells and the "
              f"checkpoints of interrupted ones are kept in {out}: run the same command again "
              "to continue", file=sys.stderr)
        return 128 + signal.Signals[name].value
    if failed:
        print(f"{len(failed)} cell(s) failed (see cells/*/error.txt); run again to retry: "
              + " ".join(failed), file=sys.stderr)
        return 1
    return 0
