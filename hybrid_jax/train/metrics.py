"""Run outputs: `metrics.jsonl` (one JSON object per log step or eval), `results.json` (the
final metrics), TensorBoard event files under `tensorboard/`, and a progress display (step,
loss, tokens/s, ETA).

Every line of `metrics.jsonl`, and `results.json`, is strict JSON: a non-finite value (a NaN
grad norm, an infinite perplexity) is written as the string "NaN", "Infinity" or "-Infinity",
not as the bare `NaN` / `Infinity` Python's `json` writes, which `jq`, JavaScript's
`JSON.parse` and other strict parsers refuse. `read_metrics` and `read_results` read those
strings back as floats (so does `float()`, and JavaScript's `Number()`)."""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hybrid_jax.files import write_atomic


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of `RUN_DIR/metrics.jsonl`: a torn line (from a kill) is skipped, and so is
    any other line that is not a record (a JSON object with a step: `plot`, `inspect` and a
    resume's `truncate` read each one's step)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(_from_json(record))
    return records


# How a non-finite float is written (the spellings of Python's `float()` and JavaScript's).
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _to_json(value: Any) -> Any:
    """`value` with every non-finite float as its `_NONFINITE` string: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    """The inverse of `_to_json`: a `_NONFINITE` string is its float again."""
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def json_line(record: dict[str, Any]) -> str:
    """`record` as one line of `metrics.jsonl` (newline included), strict JSON."""
    return json.dumps(_to_json(record), allow_nan=False) + "\n"


def write_results(run_dir: str | Path, results: dict[str, Any]) -> None:
    """`RUN_DIR/results.json`, strict JSON, replaced whole (a kill mid-write leaves the old file
    or none, never a torn one that a later reader would fail on)."""
    write_atomic(Path(run_dir) / "results.json",
                 json.dumps(_to_json(results), indent=2, allow_nan=False))


def read_results(run_dir: str | Path) -> dict[str, Any]:
    """`RUN_DIR/results.json` with its non-finite values as floats again."""
    return _from_json(json.loads((Path(run_dir) / "results.json").read_text()))


# Numbers the event files this process opens: tensorboardX names a file by the second it was
# opened and truncates one of the same name, so two writers of one second would lose the first's.
_EVENT_FILES = itertools.count()


class MetricsLog:
    """Appends one JSON object per line to `DIR/metrics.jsonl` and scalars to TensorBoard
    (nothing on disk when dir is None)."""

    def __init__(self, out_dir: Path | None, *, tensorboard: bool = True):
        self.path = None if out_dir is None else Path(out_dir) / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []
        self.writer = None
        # The last step TensorBoard may hold: unknown (inf) where an earlier process wrote.
        self.tensorboard_step = -math.inf
        if out_dir is not None and tensorboard:
            from tensorboardX import SummaryWriter

            folder = Path(out_dir) / "tensorboard"
            if any(folder.glob("*tfevents*")):
                self.tensorboard_step = math.inf
            self.writer = SummaryWriter(str(folder), flush_secs=30, filename_suffix=(
                f".{os.getpid()}.{next(_EVENT_FILES):06d}"))

    def truncate(self, step: int) -> None:
        """Drops the metric records after `step` (a resumed or rolled-back run writes them
        again), in TensorBoard too; events (rollbacks, resumes, interruptions) are history and
        stay in the JSON lines."""
        keep = lambda r: r["step"] <= step or "event" in r
        self._purge_tensorboard(step)
        if self.path is None or not self.path.is_file():
            self.history = [r for r in self.history if keep(r)]
            return
        self.history = [r for r in read_metrics(self.path.parent) if keep(r)]
        write_atomic(self.path, "".join(json_line(r) for r in self.history))

    def _purge_tensorboard(self, step: int) -> None:
        """Writes the restart marker of tensorboardX's `purge_step` at `step + 1`: TensorBoard
        drops every event read before it from that step on, so the steps written again draw one
        curve, not two overlapping ones. Written only where later steps may have been logged
        (a resumed run, a rollback)."""
        if self.writer is None or self.tensorboard_step <= step:
            return
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self.writer.file_writer.add_event(
            Event(step=step + 1, session_log=SessionLog(status=SessionLog.START)))
        self.writer.flush()
        self.tensorboard_step = step

    def write(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json_line(record))
        if self.writer is not None and "event" not in record:  # events are history, no curves
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                    tag = f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"
                    self.writer.add_scalar(tag, value, record["step"])
                    self.tensorboard_step = max(self.tensorboard_step, record["step"])
            self.writer.flush()  # a kill loses nothing already logged

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Progress:
    """A tqdm bar on a terminal (loss, tok/s, ETA); plain log lines otherwise (CI, pipes)."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
        self.interactive = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                        disable=not self.interactive)
        self.start, self.initial = time.perf_counter(), initial

    def update(self, steps: int = 1) -> None:
        self.bar.update(steps)

    def set(self, step: int) -> None:
        """Moves the bar to `step` (after a rollback)."""
        self.bar.n = step
        self.bar.refresh()

    def eta(self, step: int) -> str:
        done = step - self.initial
        if done <= 0:
            return "?"
        left = (time.perf_counter() - self.start) / done * (self.bar.total - step)
        return time.strftime("%H:%M:%S", time.gmtime(left))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        text = {k: f"{v:.4g}" for k, v in metrics.items()}
        if self.interactive:
            self.bar.set_postfix(text, refresh=True)
        elif self.enabled:
            fields = " ".join(f"{k}={v}" for k, v in text.items())
            print(f"step {step}/{self.bar.total} {fields} eta={self.eta(step)}", flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            self.bar.write(text, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()
