"""Timing helpers shared by the benchmark scripts: compiled fwd / fwd+bwd, medians, tables,
the relative error of their GPU checks."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import itertools
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

CALLS = 5
"""Back-to-back calls per timed repeat of the op benchmarks (`measure`, and the fla peer's
`peers/fla_linear.time_ms`): the host's dispatch and its wait for the device are paid once per
repeat, not once per call, as in a training step where the ops follow one another. One call
per repeat added ≈ 0.1–0.3 ms to a 1 ms op (the gated delta rule's forward: 1.31–1.46 ms wall
against 1.10 ms of kernels, 2026-12-01)."""


WARMUP_S = 0.5
"""Seconds of warm-up calls before timing (at least the `warmup` count), here and in the fla
peer's `time_ms`: the first op a fresh process timed after two calls read up to 40 % slow
(fla's SSD forward 0.54-0.61 ms timed first, 0.43 after another op; H200, 2026-12-03)."""


def time_compiled(fn: Callable, *args: Any, warmup: int = 3, iters: int = 10,
                  calls: int = 1) -> float:
    """Median over `iters` repeats of the wall time in ms per call of `calls` back-to-back
    calls of an already-jitted `fn(*args)`, synchronised with the device after the last;
    after `warmup` calls and at least `WARMUP_S` seconds of them."""
    start = time.perf_counter()
    for i in itertools.count():
        jax.block_until_ready(fn(*args))
        if i + 1 >= warmup and time.perf_counter() - start >= WARMUP_S:
            break
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


HBM_TB_S = 4.3
"""H200 copy bandwidth in TB/s, measured (DESIGN.md): the byte floors of the kernel tables."""


def error_text(e: BaseException, limit: int | None = 160) -> str:
    """A table cell for an exception: its type and the first line of its message (at most
    `limit` characters, None: no limit; an empty message, e.g. a bare `assert`'s, has none)."""
    message = str(e).strip()
    return f"{type(e).__name__}: {message.splitlines()[0][:limit] if message else ''}"


def measure_into(row: dict[str, Any], deadline: float, measure: Callable[..., dict],
                 *args: Any) -> None:
    """`row.update(measure(*args))`; past `deadline` (`time.perf_counter()` seconds) the row
    is marked skipped instead, and an exception (a kernel that does not compile, out of
    memory) goes into its "error" cell."""
    if time.perf_counter() > deadline:
        row["error"] = "skipped: time budget spent"
        return
    try:
        row.update(measure(*args))
    except Exception as e:  # noqa: BLE001  (report and go on with the next row)
        row["error"] = error_text(e)


def floor_columns(row: dict[str, Any], floors_ms: dict[str, float]) -> None:
    """Per part ("fwd", "fwd_bwd"): `{part}_floor_ms` and, when `{part}_ms` was measured,
    `{part}_x_floor`, its multiple of the floor."""
    for part, floor_ms in floors_ms.items():
        row[f"{part}_floor_ms"] = floor_ms
        if f"{part}_ms" in row:
            row[f"{part}_x_floor"] = row[f"{part}_ms"] / floor_ms


def forward_and_backward(op: Callable, num_args: int) -> tuple[Callable, Callable]:
    """Jitted forward, and forward+backward (gradient of a weighted sum w.r.t. all inputs)."""
    fwd = jax.jit(op)

    def loss(*args):
        return jnp.sum(op(*args).astype(jnp.float32))

    bwd = jax.jit(jax.grad(loss, argnums=tuple(range(num_args))))
    return fwd, bwd


def measure(fn: Callable, inputs: Sequence[Any], flops: float | None = None,
            memory: bool = True) -> dict[str, Any]:
    """Compiles fwd and fwd+bwd once each, times them (`CALLS` back-to-back calls a repeat;
    with the forward's useful `flops`, also TFLOP/s, fwd+bwd counted as 3.5 × fwd, the
    flash-attention convention), reads the fwd+bwd temp memory; an error (out of memory,
    unsupported shape) is reported in the row."""
    fwd, fwd_bwd = forward_and_backward(fn, len(inputs))
    row: dict[str, Any] = {}
    try:
        fwd = fwd.lower(*inputs).compile()
        row["fwd_ms"] = time_compiled(fwd, *inputs, calls=CALLS)
        fwd_bwd = fwd_bwd.lower(*inputs).compile()
        row["fwd_bwd_ms"] = time_compiled(fwd_bwd, *inputs, calls=CALLS)
        if flops is not None:
            row["fwd_TFLOPs"] = flops / row["fwd_ms"] / 1e9
            row["fwd_bwd_TFLOPs"] = 3.5 * flops / row["fwd_bwd_ms"] / 1e9
        analysis = fwd_bwd.memory_analysis() if memory else None
        if analysis is not None:
            row["temp_MiB"] = analysis.temp_size_in_bytes / 2**20
    except Exception as e:  # noqa: BLE001  (report and go on with the next row)
        row["error"] = error_text(e, 120)
    return row


def cudnn_op(window: int | None) -> Callable:
    """Sliding-window (w keys, itself included) or causal (window None) cuDNN attention."""
    local = None if window is None else (window - 1, 0)
    return lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, local_window_size=local, implementation="cudnn")


def temp_bytes(fn: Callable, *args: Any) -> int | None:
    """Temporary device memory the compiled `fn` needs (None where the backend cannot say)."""
    analysis = fn.lower(*args).compile().memory_analysis()
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def device_name() -> str:
    device = jax.devices()[0]
    return f"{device.device_kind} ({device.platform}, jax {jax.__version__})"


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = [max([len(c), *(len(_fmt(r.get(c))) for r in rows)]) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(w) for c, w in zip(columns, widths, strict=True)))


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """The rows as a Markdown table (for BENCHMARKS.md), numbers as in `print_table`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def write_json(path: str | Path, name: str, rows: Sequence[dict[str, Any]], *,
               quiet: bool = False, **extra: Any) -> None:
    """The rows and `extra` as one JSON record (rewritten whole: a script may save as it goes,
    `quiet` then leaves out the "wrote" line)."""
    record = {"benchmark": name, "device": device_name(), "host": platform.node(),
              "date": time.strftime("%Y-%m-%d"), **extra, "rows": list(rows)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2))
    if not quiet:
        print(f"wrote {path}")


def run_parts(parts: dict[str, Callable[[Any], Any]], names: str, args: Any, out: str | Path,
              benchmark: str, **extra: Any) -> dict[str, Any]:
    """`parts[name](args)` for each comma-separated name of `names`, in order: a part that
    fails is reported (in the record too) and the others still run; the JSON record (`extra`
    and the results so far) is rewritten after every part, so that a time limit keeps what
    was done."""
    results: dict[str, Any] = {}
    for part in names.split(","):
        try:
            results[part] = parts[part](args)
        except Exception as e:  # noqa: BLE001  (one failed part must not cost the others)
            print(f"part {part} failed: {type(e).__name__}: {e}", flush=True)
            results[part] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        write_json(out, benchmark, [], **extra, **results)
    return results


def parse_labels(text: str, known: Sequence[str], flag: str = "--variants") -> list[str]:
    """A benchmark's variant labels: "all" (every label of `known`, in its order), "none" or ""
    (no label), or ';'-separated labels of `known` (an unknown one raises, naming them)."""
    if text in ("none", ""):
        return []
    labels = list(known) if text == "all" else [label.strip() for label in text.split(";")]
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"{flag}: unknown {unknown}; expected all, none or ';'-separated "
                         f"labels of {list(known)}")
    return labels


def relative_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ in float64 (a GPU check's bf16 result `a` against its reference `b`)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def parse_changes(text: str, blocks: type) -> dict[str, Any]:
    """'FIELD=VALUE,...' → {field: value} for fields of the dataclass `blocks` (a kernel's
    BlockSizes); values as Python literals. Bad input raises argparse's type error."""
    changes = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in {f.name for f in dataclasses.fields(blocks)} or not value:
            raise argparse.ArgumentTypeError(
                f"expected FIELD=VALUE with a field of {blocks.__module__}.{blocks.__name__}, "
                f"got {item!r}")
        changes[name] = ast.literal_eval(value)
    return changes


KERNEL_PACKAGES = ("delta_rule", "flash_attention", "nha", "rms_norm", "short_conv", "ssd")


def parse_kernel_changes(text: str) -> dict[str, dict[str, Any]]:
    """'KERNEL:FIELD=VALUE,...;KERNEL:...' → {kernel: changes} for the kernel packages of
    `pallas_kernels` (`KERNEL_PACKAGES`), each part as `parse_changes` reads it against that
    kernel's BlockSizes. Bad input raises argparse's type error."""
    changes = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kernel, _, fields = part.partition(":")
        if kernel not in KERNEL_PACKAGES or not fields:
            raise argparse.ArgumentTypeError(
                f"expected KERNEL:FIELD=VALUE,... with KERNEL one of {list(KERNEL_PACKAGES)}, "
                f"got {part!r}")
        blocks = importlib.import_module(f"pallas_kernels.{kernel}.block_sizes").BlockSizes
        changes[kernel] = parse_changes(fields, blocks)
    return changes


@contextlib.contextmanager
def changed_kernel_defaults(changes: dict[str, dict[str, Any]]):
    """`changed_defaults` for each kernel package of `parse_kernel_changes`' result."""
    with contextlib.ExitStack() as stack:
        for kernel, fields in changes.items():
            api = importlib.import_module(f"pallas_kernels.{kernel}.api")
            stack.enter_context(changed_defaults(api, fields))
        yield


@contextlib.contextmanager
def changed_defaults(api: Any, changes: dict[str, Any]):
    """Within the block, `api.default_block_sizes` (a kernel package's api module) returns its
    tiles with `changes` applied: an option's GPU check or timing before it is a default."""
    if not changes:
        yield
        return
    defaults = api.default_block_sizes
    api.default_block_sizes = lambda *a, **kw: dataclasses.replace(defaults(*a, **kw), **changes)
    print("default tiles changed:", changes, flush=True)
    try:
        yield
    finally:
        api.default_block_sizes = defaults

