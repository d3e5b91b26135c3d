"""Run outputs: `metrics.jsonl` (one line per log step) and a progress display."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


class MetricsLog:
    """Appends one JSON object per line to `DIR/metrics.jsonl` (nothing when dir is None)."""

    def __init__(self, out_dir: Path | None):
        self.path = None if out_dir is None else Path(out_dir) / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


class Progress:
    """A tqdm bar on a terminal; plain log lines otherwise (CI logs, pipes)."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
        self.interactive = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                        disable=not self.interactive)
        self.start = time.perf_counter()

    def update(self, steps: int = 1) -> None:
        self.bar.update(steps)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        text = {k: f"{v:.4g}" for k, v in metrics.items()}
        if self.interactive:
            self.bar.set_postfix(text, refresh=True)
        elif self.enabled:
            fields = " ".join(f"{k}={v}" for k, v in text.items())
            print(f"step {step}/{self.bar.total} {fields}", flush=True)

    def close(self) -> None:
        self.bar.close()
