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

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph

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


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?\bcalls=%?([\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_TABLE_ROW = re.compile(r"^(\d+)\s+(.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_LIBRARIES = re.compile(r"/(jax|jaxlib|flax|optax|numpy|contextlib|functools)/|^<")


def _hlo_tables(lines: list[str]) -> dict[str, dict[int, Any]]:
    """The module's FileNames / FunctionNames (id → string) and FileLocations / StackFrames
    (id → fields) tables, as newer XLA prints them before the computations."""
    tables, current = {}, None
    for line in lines:
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
            continue
        match = _TABLE_ROW.match(line) if current is not None else None
        if not match:
            current = None if not line.strip() else current
            continue
        key, value = int(match.group(1)), match.group(2)
        current[key] = (value.strip('"') if value.startswith('"') else
                        {k: int(v) for k, v in _FIELD.findall(value)})
    return tables


def _frame_source(tables, frame: int) -> str:
    """"file:line function" of the innermost frame outside the libraries (else the innermost)."""
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations, frames = tables.get("FileLocations", {}), tables.get("StackFrames", {})
    found, seen = None, set()
    while frame in frames and frame not in seen:
        seen.add(frame)
        location = locations.get(frames[frame].get("file_location_id"), {})
        file = files.get(location.get("file_name_id"), "?")
        short = re.sub(r"^.*?/(?=(hybrid_jax|experiments|pallas_kernels)/)|^.*/site-packages/",
                       "", file)
        function = functions.get(location.get("function_name_id"), "?")
        source = f"{short}:{location.get('line', '?')} {function}"
        found = found or source
        if not _LIBRARIES.search(file):
            return source
        frame = frames[frame].get("parent_frame_id", 0)
    return found or "?"


def _op_source(tables, line: str) -> str | None:
    frame = re.search(r"stack_frame_id=(\d+)", line)
    if frame:
        source = _frame_source(tables, int(frame.group(1)))
    else:  # older XLA: the file and line inline
        file, number = (re.search(rf'{key}="?([^" ,}}]+)', line)
                        for key in ("source_file", "source_line"))
        if not file:
            return None
        source = f"{Path(file.group(1)).name}:{number.group(1) if number else '?'}"
    name = re.search(r'op_name="([^"]*)"', line)
    backward = name is not None and "transpose(" in name.group(1)
    return f"{source} [{'bwd' if backward else 'fwd'}]"


def _source_counts(hlo_text: str, names) -> dict[str, collections.Counter]:
    """Per kernel name that calls an HLO computation (a fusion), its ops counted by source."""
    lines = hlo_text.splitlines()
    tables = _hlo_tables(lines)
    bodies, calls, current = {}, {}, None
    for line in lines:
        start = _COMPUTATION.match(line)
        if start:
            current = bodies.setdefault(start.group(1), [])
            continue
        if line.startswith("}"):
            current = None
        elif current is not None:
            current.append(line)
            call = _INSTRUCTION.match(line)
            if call:  # the GPU names a fusion's kernel after it with "." as "_"
                for name in (call.group(1), call.group(1).replace(".", "_")):
                    calls.setdefault(name, call.group(2))
    result = {}
    for name in names:
        counts = collections.Counter(
            source for line in bodies.get(calls.get(name, ""), [])
            if (source := _op_source(tables, line)))
        if counts:
            result[name] = counts
    return result


def kernel_sources(hlo_text: str, names: list[str], top: int = 3) -> dict[str, list[str]]:
    """Per kernel name (an HLO instruction that calls a computation, e.g. a fusion), its ops'
    most frequent sources, "path:line function [fwd|bwd] ×count", most ops first; names the
    HLO does not define are left out."""
    return {name: [f"{s} ×{n}" for s, n in counts.most_common(top)]
            for name, counts in _source_counts(hlo_text, names).items()}


def time_by_source(kernels: list[dict[str, Any]], hlo_text: str) -> list[dict[str, Any]]:
    """The fusions' time summed by the function (and direction) most of each one's ops come
    from, largest first, with "(not a fusion)" for the rest (custom calls: library matmuls,
    Pallas kernels, copies), so a profile reads as ms per step by code, not by kernel name."""
    counts = _source_counts(hlo_text, [row["name"] for row in kernels])
    sums = collections.defaultdict(lambda: {"ms_per_step": 0.0, "kernels": 0, "largest": ""})
    for row in kernels:
        source = counts.get(row["name"])
        key = (re.sub(r":\d+ ", " ", source.most_common(1)[0][0]) if source
               else "(not a fusion)")
        entry = sums[key]
        if not entry["largest"]:
            entry["largest"] = row["name"]  # the rows come largest first
        entry["ms_per_step"] += row["ms_per_step"]
        entry["kernels"] += 1
    return sorted(({"source": k, **v} for k, v in sums.items()),
                  key=lambda r: -r["ms_per_step"])


def print_summary(summary: dict[str, Any], top: int = 30) -> None:
    from experiments.benchmarks.timing import print_table

    print(f"{summary['trace']}: {summary['events']} events ({summary['selection']}); "
          f"device time {summary['device_ms_per_step']:.2f} ms per step")
    print_table(summary["categories"], ["category", "count", "ms_per_step", "share"])
    shown = [{**r, "name": r["name"][:100]} for r in summary["kernels"][:top]]
    print_table(shown, ["name", "category", "count", "ms_per_step", "share", "mean_us"])


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--process", default=GPU_PROCESS)
    parser.add_argument("--thread", default=STREAM_THREAD)
    args = parser.parse_args()
    print_summary(summarize(args.trace, args.steps, args.process, args.thread), args.top)


if __name__ == "__main__":
    run_with_logging(main)
