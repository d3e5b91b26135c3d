"""Where a profiled run's device time goes: the kernels of a `jax.profiler.trace` by total time.

    python -m experiments.benchmarks.trace_summary TRACE_DIR_OR_FILE [--steps N] [--top 30]

Reads the Chrome-trace JSON that `jax.profiler.trace(..., create_perfetto_trace=True)` writes
(`plugins/profile/<run>/perfetto_trace.json.gz` or `<host>.trace.json.gz`; a directory means
its newest one; plain or gzipped, a `{"traceEvents": [...]}` object or a bare event list).
Complete events (`"ph": "X"`, `ts`/`dur` in µs) of the processes whose name matches
`process` (default: GPU devices) and of their threads whose name matches `thread` (default:
the CUDA streams, where each event is one kernel or copy) are summed by name. When no thread
of those processes matches `thread` (a CPU trace, another profiler version), every thread of
them is taken and the summary says so, rather than finding nothing.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import tempfile
from pathlib import Path
from typing import Any

GPU_PROCESS = r"/device:GPU|GPU:\d"
STREAM_THREAD = r"^Stream"
# Kind of a kernel by its name, first match (for the one-line breakdown).
CATEGORIES = (("attention", r"flash|fmha|attention|cudnn|sdpa"),
              ("matmul", r"gemm|xmma|cutlass|cublas|nvjet|matmul|dot|wgmma"),
              ("copy", r"memcpy|memset|copy|transpose"),
              ("reduction", r"reduce|reduction|scan|sort"),
              ("fusion", r"fusion|elementwise|convert"))


def trace_file(path: str | Path) -> Path:
    """The trace JSON under `path` (a file, or the newest trace below a directory)."""
    path = Path(path)
    if path.is_file():
        return path
    found = [p for pattern in ("**/perfetto_trace.json*", "**/*.trace.json*")
             for p in path.glob(pattern)]
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json[.gz] or *.trace.json[.gz] under {path}")
    return max(found, key=lambda p: (p.stat().st_mtime, p.name.startswith("perfetto")))


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The trace events of a Chrome-trace JSON file (gzipped or not)."""
    path = trace_file(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: expected a list of trace events, got {type(events).__name__}")
    return [e for e in events if isinstance(e, dict)]


def _names(events, kind: str) -> dict:
    """pid (or (pid, tid)) → name, from the metadata events."""
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == kind:
            key = e.get("pid") if kind == "process_name" else (e.get("pid"), e.get("tid"))
            names[key] = str((e.get("args") or {}).get("name", ""))
    return names


def device_events(events, process: str = GPU_PROCESS, thread: str = STREAM_THREAD
                  ) -> tuple[list[dict], str]:
    """The complete events of the matching processes' matching threads, and a note saying
    which threads were taken."""
    processes = {pid for pid, name in _names(events, "process_name").items()
                 if re.search(process, name)}
    threads = _names(events, "thread_name")
    complete = [e for e in events if e.get("ph") == "X" and e.get("pid") in processes]
    chosen = {key for key, name in threads.items()
              if key[0] in processes and re.search(thread, name)}
    if chosen:
        names = sorted({threads[key] for key in chosen})
        return ([e for e in complete if (e.get("pid"), e.get("tid")) in chosen],
                f"threads {names[:4]}{' ...' if len(names) > 4 else ''}")
    return complete, f"no thread matches {thread!r}: all threads of the matching processes"


def category(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, pattern in CATEGORIES if re.search(pattern, lowered)), "other")


def kernel_table(events, steps: int = 1) -> list[dict[str, Any]]:
    """Per name: count, total ms, ms per step, share of the summed time, mean µs; largest
    total first."""
    count, total = collections.Counter(), collections.Counter()
    for e in events:
        name = str(e.get("name", "?"))
        count[name] += 1
        total[name] += float(e.get("dur", 0.0))
    whole = sum(total.values()) or 1.0
    return [{"name": name, "category": category(name), "count": count[name],
             "total_ms": us / 1e3, "ms_per_step": us / 1e3 / steps, "share": us / whole,
             "mean_us": us / count[name]} for name, us in total.most_common()]


def category_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kernel table summed by category."""
    sums = collections.defaultdict(lambda: {"count": 0, "total_ms": 0.0, "ms_per_step": 0.0,
                                            "share": 0.0})
    for row in rows:
        entry = sums[row["category"]]
        for key in entry:
            entry[key] += row[key]
    return sorted(({"category": k, **v} for k, v in sums.items()),
                  key=lambda r: -r["total_ms"])


def summarize(path: str | Path, steps: int = 1, process: str = GPU_PROCESS,
              thread: str = STREAM_THREAD) -> dict[str, Any]:
    """The kernel and category tables of a trace, the device time per step, and which events
    were read."""
    events, note = device_events(load_events(path), process, thread)
    rows = kernel_table(events, steps)
    return {"trace": str(trace_file(path)), "events": len(events), "selection": note,
            "device_ms_per_step": sum(r["ms_per_step"] for r in rows), "kernels": rows,
            "categories": category_table(rows)}


def trace_calls(fn, args, runs: int, directory: str | Path | None = None,
                prefix: str = "trace_") -> dict[str, Any]:
    """`summarize` (per call) of `runs` calls of an already compiled and warm `fn(*args)` under
    `jax.profiler.trace`, written to a new folder inside `directory` (default: the temp dir)."""
    import jax  # only here: the rest of this module reads trace files without JAX

    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        for _ in range(runs):
            jax.block_until_ready(fn(*args))
    return summarize(folder, runs)


def print_summary(summary: dict[str, Any], top: int = 30) -> None:
    from experiments.benchmarks.timing import print_table

    print(f"{summary['trace']}: {summary['events']} events ({summary['selection']}); "
          f"device time {summary['device_ms_per_step']:.2f} ms per step")
    print_table(summary["categories"], ["category", "count", "ms_per_step", "share"])
    shown = [{**r, "name": r["name"][:100]} for r in summary["kernels"][:top]]
    print_table(shown, ["name", "category", "count", "ms_per_step", "share", "mean_us"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--process", default=GPU_PROCESS)
    parser.add_argument("--thread", default=STREAM_THREAD)
    args = parser.parse_args()
    print_summary(summarize(args.trace, args.steps, args.process, args.thread), args.top)


if __name__ == "__main__":
    main()
