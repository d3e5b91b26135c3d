"""Where a train step's time goes: N steps of a benchmark model under `jax.profiler.trace`, the
GPU kernels by total time, packed text against unpacked random tokens.

    python -m experiments.benchmarks.profile_step [--model transformer-125m] [--length 2048]
        [--tokens 32768] [--data wikitext2_bpe32k.npz] [--modes packed,unpacked] [--steps 5]
        [--attention pallas] [--conv pallas] [--oryx-modes random_chunks] [--scan] [--top 25]
        [--kernel-changes 'ssd:FIELD=VALUE,...;...'] [--trace-dir DIR]
        [--out profile_step.json]
        [--process REGEX --thread REGEX]   (which trace rows; default the GPU streams)

Each mode builds the step exactly as `train_throughput.py` does (`build_step`: any preset, the
trainer's own train state and step, compiled; packed = text windows from `--data` with segment
ids and restarting positions, or synthetic documents without it; unpacked = random tokens
without segment ids), runs 2 warm-up steps, times `--steps` steps, then traces `--steps` more. It
prints per mode the kernel categories and the top kernels (name, count, ms per step, share,
mean µs; `trace_summary.py`), and with two modes the kernels whose time per step differs most
between them: one GPU call says where the packed step's extra time goes. For the top kernels
that are fusions it prints the source lines their ops come from, and every kernel's time summed
by the function most of its ops come from (`trace_summary.kernel_sources`, `time_by_source`, on
the compiled step's HLO). `--kernel-changes` profiles the step with kernels' default tiles
changed (`timing.parse_kernel_changes`, as train_throughput's). JSON: every table.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import jax

from experiments.benchmarks import trace_summary
from experiments.benchmarks.timing import (
    changed_kernel_defaults,
    device_name,
    parse_kernel_changes,
    print_table,
    write_json,
)
from experiments.benchmarks.train_throughput import build_step
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph


def profile_mode(args, mode: str, trace_dir: Path) -> dict:
    built = build_step(args.model, args.length, tokens=args.tokens, data=args.data,
                       remat=args.remat, scan=args.scan, packed=mode == "packed",
                       attention=args.attention, conv=args.conv, modes=args.oryx_modes)
    step, batches = built.step, built.batches

    def run(state, steps):
        for i in range(steps):
            state, _ = step(state, batches[i % len(batches)])
        return state

    state = built.state
    state = jax.block_until_ready(run(state, 2))
    start = time.perf_counter()
    state = jax.block_until_ready(run(state, args.steps))
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    directory = trace_dir / mode
    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        state = jax.block_until_ready(run(state, args.steps))
    summary = trace_summary.summarize(directory, args.steps, args.process, args.thread)
    print(f"\n== {args.model} T {args.length} {mode}: {step_ms:.2f} ms per step (untraced), "
          f"compile {built.info['compile_s']:.1f} s, {built.info.get('docs_per_row', 1):.2f} "
          f"documents per row", flush=True)
    trace_summary.print_summary(summary, args.top)
    hlo = built.step.as_text()
    names = [row["name"] for row in summary["kernels"][:args.top]]
    sources = trace_summary.kernel_sources(hlo, names)
    print("\nwhere the top kernels come from (ops by innermost source line, fwd / bwd):")
    for name, lines in sources.items():
        print(f"  {name[:60]}: " + "; ".join(lines))
    by_source = trace_summary.time_by_source(summary["kernels"], hlo)
    print("\nevery kernel's time by the code most of its ops come from:")
    print_table(by_source[:args.top], ["source", "ms_per_step", "kernels", "largest"])
    return {"mode": mode, "step_ms": step_ms, **built.info, **summary, "sources": sources,
            "by_source": by_source}


def differences(profiles: list[dict], top: int) -> list[dict]:
    """Kernels by |ms per step of the first mode − the second|, largest first."""
    first, second = ({r["name"]: r["ms_per_step"] for r in p["kernels"]} for p in profiles)
    rows = [{"name": name[:100], profiles[0]["mode"]: first.get(name, 0.0),
             profiles[1]["mode"]: second.get(name, 0.0),
             "difference": first.get(name, 0.0) - second.get(name, 0.0)}
            for name in set(first) | set(second)]
    return sorted(rows, key=lambda r: -abs(r["difference"]))[:top]


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--model", default="transformer-125m")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--data", default="")
    parser.add_argument("--modes", default="packed,unpacked")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--remat", default="none")
    parser.add_argument("--scan", action=argparse.BooleanOptionalAction, default=False,
                        help="scan the layers (default unscanned, as train_throughput and the "
                             "library)")
    parser.add_argument("--attention", default=None, help="force an ops.attention rung")
    parser.add_argument("--conv", default=None, help="force an ops.short_conv rung")
    parser.add_argument("--oryx-modes", default="random_chunks",
                        help="the Oryx models' training mode schedule (train_throughput's)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--kernel-changes", type=parse_kernel_changes, default={},
                        help="KERNEL:FIELD=VALUE,...;...: the kernels' default tiles changed")
    parser.add_argument("--trace-dir", default="")
    parser.add_argument("--process", default=trace_summary.GPU_PROCESS,
                        help="trace processes to read (e.g. /host:CPU for a CPU smoke run)")
    parser.add_argument("--thread", default=trace_summary.STREAM_THREAD)
    parser.add_argument("--out", default="profile_step.json")
    args = parser.parse_args()
    print(device_name(), flush=True)
    trace_dir = Path(args.trace_dir or tempfile.mkdtemp(prefix="profile_step_"))
    profiles, failed = [], []
    with changed_kernel_defaults(args.kernel_changes):
        for mode in args.modes.split(","):
            try:
                profiles.append(profile_mode(args, mode, trace_dir))
            except Exception as e:  # noqa: BLE001  (one failed mode must not cost the other)
                failed.append({"mode": mode, "error": f"{type(e).__name__}: {str(e)[:1000]}"})
                print(f"mode {mode} failed: {failed[-1]['error']}", flush=True)
    diff = []
    if len(profiles) == 2:
        a, b = (p["mode"] for p in profiles)
        print(f"\n== step: {a} {profiles[0]['step_ms']:.2f} ms, {b} {profiles[1]['step_ms']:.2f}"
              f" ms; device time {profiles[0]['device_ms_per_step']:.2f} vs "
              f"{profiles[1]['device_ms_per_step']:.2f} ms. Largest differences per step:")
        by_kind = collections.defaultdict(lambda: [0.0, 0.0])
        for i, profile in enumerate(profiles):
            for row in profile["categories"]:
                by_kind[row["category"]][i] += row["ms_per_step"]
        print_table([{"category": k, a: v[0], b: v[1], "difference": v[0] - v[1]}
                     for k, v in sorted(by_kind.items())], ["category", a, b, "difference"])
        diff = differences(profiles, args.top)
        print_table(diff, ["name", a, b, "difference"])
    for profile in profiles:  # the JSON keeps the top kernels only
        profile["kernels"] = profile["kernels"][:4 * args.top]
    write_json(args.out, "profile_step", [], model=args.model, length=args.length,
               tokens=args.tokens, steps=args.steps, profiles=profiles, failed=failed,
               kernel_changes=args.kernel_changes,
               differences=diff,
               trace_dir=str(trace_dir))


if __name__ == "__main__":
    run_with_logging(main)
