"""Sweeps: architecture × parameter budget × learning rate × seed, one training run per cell.

Each cell is an ordinary run directory `OUT/cells/<cell>/` (config.json, metrics.jsonl,
checkpoint, results.json) plus `cell.json`, its summary, written last and atomically. After
training, a cell evaluates its model on the sweep's `eval_variants` (the data config with some
fields changed, e.g. `seq_len=400` for length generalisation, or a shifted distribution knob
for OOD tests). Running a sweep again skips finished cells and only evaluates the variants a
cell's summary lacks, so sweeps that train the same models (e.g. selective copying and its
length-generalisation and OOD evaluations) can share one output directory; a cell trained with
a different configuration, or holding a variant's label evaluated with other changes (the
summary records each variant's changes), is an error, not silently reused. Cells run in `jobs`
worker processes; `report.write_report` turns the summaries into a CSV, Markdown tables and a
plot, and lists the cells without results (failed, with the reason, or not run).
A SIGINT / SIGTERM stops the whole sweep (`SweepStopped`), not only the cell it reached: no
other cell starts, an interrupted cell keeps its checkpoint and continues on the next run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from experiments.expressivity.models import (
    ARCHITECTURES,
    STUDY_ARCHITECTURES,
    ModelFamily,
    size_model,
)
from experiments.files import check_same_config, number_id
from hybrid_jax.config import ExperimentConfig, TrainConfig
from hybrid_jax.files import write_atomic
from hybrid_jax.train.run_dir import RunLock

# Tiny models, short runs: no weight decay, one synchronous checkpoint per cell (at the end).
DEFAULT_TRAIN = TrainConfig(steps=1000, batch_size=32, warmup_steps=50, weight_decay=0.0,
                            log_every=100, eval_batches=16, keep_checkpoints=1,
                            async_checkpoint=False)

# Paper numbers: {budget: {architecture: accuracy}} for the side-by-side table.
PaperTable = tuple[tuple[int, tuple[tuple[str, float], ...]], ...]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each grid axis holds (values from --set JSON are not typed by the parser): a budget of
# 2e3 named its cells "p2000.0", beside the "p2000" cells of the same models.
# (Their ranges are checked where they are used: size_model, TrainConfig.)
_GRID_VALUES = {
    "budgets": (_is_int, "integers (parameters)"),
    "learning_rates": (lambda v: isinstance(v, int | float) and not isinstance(v, bool),
                       "numbers"),
    "seeds": (_is_int, "integers"),
}
# TrainConfig fields that every cell sets from its grid axis: `train.seed=1` was ignored.
_PER_CELL = {"learning_rate": "learning_rates", "seed": "seeds"}


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A grid of training runs and how to report them.

    `eval_variants`: `(label, ((field, value), ...))` pairs; each evaluates every trained
    model on the eval split of `data` with those fields replaced. `paper`: the paper's
    accuracies to print next to ours.
    """

    name: str
    data: Any
    description: str = ""
    family: ModelFamily = ModelFamily()
    architectures: tuple[str, ...] = STUDY_ARCHITECTURES
    budgets: tuple[int, ...] = (2000, 6000)
    learning_rates: tuple[float, ...] = (3e-3,)
    seeds: tuple[int, ...] = (0,)
    train: TrainConfig = DEFAULT_TRAIN
    eval_variants: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    paper: PaperTable = ()
    paper_note: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.architectures) - set(ARCHITECTURES))
        if unknown:
            raise ValueError(f"Sweep {self.name!r}: unknown architecture(s) {unknown}; "
                             f"expected some of {sorted(ARCHITECTURES)}")
        for field, (valid, expected) in _GRID_VALUES.items():
            invalid = [v for v in getattr(self, field) if not valid(v)]
            if invalid:
                raise ValueError(f"Sweep {self.name!r}: {field}={list(getattr(self, field))} "
                                 f"holds {invalid}; expected {expected}")
        for field in ("architectures", "budgets", "learning_rates", "seeds"):
            values = getattr(self, field)
            if not values:
                raise ValueError(f"Sweep {self.name!r}: {field} is empty")
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:  # the grid would hold the same cell twice
                raise ValueError(f"Sweep {self.name!r}: {field}={list(values)} repeats "
                                 f"{repeated}; expected distinct values")
        for field, axis in _PER_CELL.items():
            if getattr(self.train, field) != getattr(TrainConfig(), field):
                raise ValueError(f"Sweep {self.name!r}: train.{field}="
                                 f"{getattr(self.train, field)} would be replaced in every cell "
                                 f"by its {axis} value; set {axis}=[...] instead")
        unknown = sorted({a for _, row in self.paper for a, _ in row} - set(ARCHITECTURES))
        if unknown:  # the report, written after every cell has trained, could not label them
            raise ValueError(f"Sweep {self.name!r}: paper names unknown architecture(s) "
                             f"{unknown}; expected some of {sorted(ARCHITECTURES)}")
        # Values parsed from --set JSON arrive as lists; keep them hashable.
        variants = tuple((label, tuple(tuple(pair) for pair in changes))
                         for label, changes in self.eval_variants)
        object.__setattr__(self, "eval_variants", variants)
        for label, _ in variants:
            self.variant_data(label)  # fails early on unknown fields or invalid values

    @property
    def short_name(self) -> str:
        """The name's last component, e.g. "selective-copying": the report's file names."""
        return self.name.rsplit("/", 1)[-1]

    def cells(self) -> list[Cell]:
        return [Cell(a, b, lr, s) for a in self.architectures for b in self.budgets
                for lr in self.learning_rates for s in self.seeds]

    def variant_changes(self, label: str) -> dict[str, Any]:
        """The fields variant `label` changes, as a cell's summary records them (JSON)."""
        return json.loads(json.dumps(dict(dict(self.eval_variants)[label])))

    def variant_data(self, label: str) -> Any:
        changes = dict(dict(self.eval_variants)[label])
        try:
            return dataclasses.replace(self.data, **changes)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Sweep {self.name!r}: eval variant {label!r} {changes}: {e}"
                             ) from None

    def experiment(self, cell: Cell) -> tuple[ExperimentConfig, int]:
        """The run of one cell and its model's exact parameter count."""
        model, params = size_model(self.family, cell.architecture, cell.budget,
                                   self.data.vocab_size)
        train = dataclasses.replace(self.train, learning_rate=cell.learning_rate,
                                    seed=cell.seed)
        return ExperimentConfig(name=f"{self.name}/{cell.id}", model=model, data=self.data,
                                train=train, description=self.description), params


@dataclasses.dataclass(frozen=True)
class Cell:
    architecture: str
    budget: int
    learning_rate: float
    seed: int

    @property
    def id(self) -> str:
        # Exact: `:g` made rates that differ past 6 digits one cell (one directory, one
        # summary read as both).
        return (f"{self.architecture}-p{self.budget}-lr{number_id(self.learning_rate)}"
                f"-s{self.seed}")


def cell_summary_path(out_dir: Path, cell: Cell) -> Path:
    return out_dir / "cells" / cell.id / "cell.json"


def cell_error_path(out_dir: Path, cell: Cell) -> Path:
    return out_dir / "cells" / cell.id / "error.txt"


def read_summary(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): delete it to evaluate the cell "
                         "again") from None


def missing_variants(sweep: Sweep, summary: dict[str, Any]) -> list[str]:
    return [label for label, _ in sweep.eval_variants if f"accuracy[{label}]" not in summary]


def _pending(sweep: Sweep, out_dir: Path, cell: Cell) -> bool:
    path = cell_summary_path(out_dir, cell)
    return not path.exists() or bool(missing_variants(sweep, read_summary(path)))


def _check_same_variants(sweep: Sweep, path: Path) -> None:
    """A variant label that a cell's summary holds with other changes is another evaluation
    (its accuracy was reused as this one's). Summaries from before variants were recorded
    cannot be checked."""
    recorded = read_summary(path).get("variants", {})
    for label, _ in sweep.eval_variants:
        if label in recorded and recorded[label] != sweep.variant_changes(label):
            raise ValueError(f"{path} holds eval variant {label!r} evaluated with "
                             f"{recorded[label]}, not {sweep.variant_changes(label)}; give "
                             "this variant another label or use another --out directory")


# What determines a cell's trained weights; the name and description differ between sweeps
# that share cells (selective copying and its length-generalisation / OOD evaluations).
_TRAINED_BY = ("model", "data", "train")


def _check_same_run(experiment: ExperimentConfig, run_dir: Path) -> ExperimentConfig | None:
    """The experiment saved in `run_dir`, if it trains the same weights as `experiment`; None
    for a cell not started (`check_same_config`)."""
    return check_same_config(run_dir, experiment, marker="cell.json", compare=_TRAINED_BY,
                             hint="use another --out directory")


class SweepStopped(Exception):
    """A signal stopped the sweep (`signal_name`); the same command continues it."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name

    def __str__(self) -> str:
        return self.signal_name


class CellInterrupted(SweepStopped):
    """A cell's training stopped on a signal (its checkpoint is saved): the sweep stops."""

    def __init__(self, cell_id: str, signal_name: str, step: int):
        Exception.__init__(self, cell_id, signal_name, step)  # its args: it pickles from a worker
        self.cell_id, self.signal_name, self.step = cell_id, signal_name, step

    def __str__(self) -> str:
        return f"{self.signal_name} in cell {self.cell_id} at step {self.step}"


class _StopSignals:
    """While worker processes run cells, in this (main) process: the first SIGINT / SIGTERM
    only records its name (`received`), so the sweep starts no other cell and waits for the
    running ones; a second raises `SweepStopped` at once. Nothing is raised inside the pool's
    bookkeeping on the first, and nothing is forwarded: a terminal's Ctrl-C or a scheduler
    that signals every process reaches the workers itself (their trainers checkpoint and stop),
    and a second signal would make those exit without a checkpoint. SIGTERM to this process
    alone (a container's PID 1, a `kill`) used to kill it and orphan the workers."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            raise SweepStopped(signal.Signals(signum).name)
        self.received = signal.Signals(signum).name

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def run_cell(sweep: Sweep, cell: Cell, out_dir: Path) -> dict[str, Any]:
    """Trains one cell (unless already trained), evaluates the variants its summary lacks and
    writes `cell.json`; returns the summary. Raises `CellInterrupted` if a signal stopped the
    training."""
    # Held while the cell trains, evaluates and writes its summary: two sweeps sharing an output
    # directory (e.g. length generalisation and OOD evaluation started together) never work on
    # one cell at once (each wrote its own variants into cell.json, losing the other's).
    with RunLock(out_dir / "cells" / cell.id, "cell.lock", "another sweep",
                 "the next run retries it"):
        return _run_cell(sweep, cell, out_dir)


def _run_cell(sweep: Sweep, cell: Cell, out_dir: Path) -> dict[str, Any]:
    from hybrid_jax.data.pipeline import eval_batches
    from hybrid_jax.sharding import make_mesh
    from hybrid_jax.train import evaluate, train
    from hybrid_jax.train.trainer import restore_train_state

    experiment, params = sweep.experiment(cell)
    run_dir = out_dir / "cells" / cell.id
    path = cell_summary_path(out_dir, cell)
    start = time.perf_counter()
    saved = _check_same_run(experiment, run_dir)
    if saved is not None:  # the trainer resumes only a run of its own name: a sibling
        # sweep's cell keeps that name
        experiment = dataclasses.replace(experiment, name=saved.name,
                                         description=saved.description)
    if path.exists():
        summary = read_summary(path)
    else:  # resume=True: an interrupted cell continues from its last checkpoint
        results = train(experiment, run_dir, progress=False, resume=True)
        if results.get("interrupted"):
            raise CellInterrupted(cell.id, results["interrupted"], results["step"])
        if results.get("accuracy") is None:
            raise RuntimeError(f"cell {cell.id} did not finish training: {results}")
        summary = {**dataclasses.asdict(cell), "params": params,
                   "d_model": experiment.model.d_model,
                   "layers": [spec.type for spec in experiment.model.layers],
                   # fewer than train.steps where train.time_limit_s stopped it
                   "steps": results["steps"], "accuracy": results["accuracy"],
                   "loss": results["eval_loss"], "train_time_s": round(results["wall_time_s"])}
    todo = missing_variants(sweep, summary)
    if todo:
        cfg = experiment.train
        ts, _ = restore_train_state(experiment, run_dir, make_mesh(cfg.mesh))
        for label in todo:
            batches = eval_batches(sweep.variant_data(label), batch_size=cfg.batch_size,
                                   num_batches=cfg.eval_batches, seed=cfg.seed)
            summary[f"accuracy[{label}]"] = evaluate(ts, batches)["accuracy"]
            summary.setdefault("variants", {})[label] = sweep.variant_changes(label)
    summary["wall_time_s"] = round(time.perf_counter() - start, 1)
    write_atomic(path, json.dumps(summary, indent=2))  # a cell.json is always complete
    cell_error_path(out_dir, cell).unlink(missing_ok=True)  # a failure of an earlier run
    return summary


def _worker_init() -> None:
    # Several workers share the CPU cores: one XLA thread each avoids oversubscription.
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""),
                                        "--xla_cpu_multi_thread_eigen=false"]).strip()


def run_sweep(sweep: Sweep, out_dir: str | Path, *, jobs: int = 1,
              log: Callable[[str], None] = print) -> tuple[list[dict[str, Any]], list[str]]:
    """Runs the cells without a `cell.json` (in `jobs` processes; 1: in this process).

    Returns `(summaries of all finished cells, ids of the cells that failed)`. A failed cell
    is logged with its traceback in `cells/<cell>/error.txt` and retried by the next run; a
    worker process that dies (e.g. killed for memory) fails its cell and starts no other. A
    signal (`CellInterrupted` from a cell; here KeyboardInterrupt, or with workers
    `_StopSignals`) starts no other cell, waits for the running ones and raises.
    """
    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs={jobs!r}: expected an integer >= 1 (worker processes)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [c for c in sweep.cells() if _pending(sweep, out_dir, c)]
    done = len(sweep.cells()) - len(todo)
    log(f"{sweep.name}: {len(sweep.cells())} cells, {done} already finished, running "
        f"{len(todo)} with {jobs} job(s) in {out_dir}")
    check_cells(sweep, out_dir)  # sizes every model too, before anything trains
    write_atomic(out_dir / f"{sweep.short_name}.sweep.json",  # the settings of its cells
                 json.dumps(_describe(sweep), indent=2, default=str))
    failed: list[str] = []

    def finished(cell: Cell, summary: dict[str, Any] | None, error: str | None) -> None:
        nonlocal done
        done += 1
        if error is not None:
            failed.append(cell.id)
            path = cell_error_path(out_dir, cell)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(error)
            log(f"[{done}/{len(sweep.cells())}] {cell.id}: FAILED ({error.splitlines()[-1]})")
        else:
            variants = "".join(f", {label} {summary[f'accuracy[{label}]']:.4f}"
                               for label, _ in sweep.eval_variants)
            log(f"[{done}/{len(sweep.cells())}] {cell.id}: params {summary['params']} "
                f"accuracy {summary['accuracy']:.4f}{variants} ({summary['wall_time_s']} s)")

    if jobs == 1:
        for cell in todo:
            try:
                finished(cell, run_cell(sweep, cell, out_dir), None)
            except CellInterrupted:
                raise
            except Exception:  # noqa: BLE001 (recorded; the other cells go on)
                finished(cell, None, traceback.format_exc())
    else:
        context = multiprocessing.get_context("spawn")
        with _StopSignals() as stop, concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_worker_init) as pool:
            # At most `jobs` cells submitted (all running): after a signal none is queued, and
            # leaving the pool waits only for the running ones.
            waiting, running = collections.deque(todo), {}
            broken = False  # a worker died (killed, e.g. for memory): no further submit works

            def submit_next() -> None:
                nonlocal broken
                if waiting and not stop.received:
                    try:
                        running[pool.submit(run_cell, sweep, waiting[0], out_dir)] = waiting[0]
                        waiting.popleft()
                    except BrokenProcessPool:
                        broken = True

            for _ in range(jobs):
                submit_next()
            while running:
                done_now, _ = concurrent.futures.wait(  # a timeout: a signal is seen soon
                    running, timeout=0.2, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done_now:
                    cell = running.pop(future)
                    try:
                        finished(cell, future.result(), None)
                    except CellInterrupted:
                        raise
                    except Exception:  # noqa: BLE001
                        finished(cell, None, traceback.format_exc())
                    submit_next()
            if stop.received:
                raise SweepStopped(stop.received)
        if broken:
            log(f"a worker process died; {len(waiting)} cell(s) not started: run again to "
                "continue")
    return collect(sweep, out_dir), failed


def check_cells(sweep: Sweep, out_dir: Path) -> None:
    """Refuses cells in `out_dir` that another configuration trained, or that hold one of the
    sweep's eval variants evaluated with other changes: a report would mix the two."""
    for cell in sweep.cells():
        summary = cell_summary_path(Path(out_dir), cell)
        if summary.exists():  # first: a damaged summary is named as such
            _check_same_variants(sweep, summary)
        _check_same_run(sweep.experiment(cell)[0], summary.parent)


def collect(sweep: Sweep, out_dir: Path) -> list[dict[str, Any]]:
    """The summaries of the sweep's finished cells, in grid order."""
    paths = [cell_summary_path(Path(out_dir), c) for c in sweep.cells()]
    return [read_summary(p) for p in paths if p.exists()]


def unfinished(sweep: Sweep, out_dir: Path) -> dict[str, str]:
    """The sweep's cells without a summary: id -> why (the last line of its error.txt)."""
    reasons = {}
    for cell in sweep.cells():
        if not cell_summary_path(Path(out_dir), cell).exists():
            error = cell_error_path(Path(out_dir), cell)
            lines = error.read_text().strip().splitlines() if error.exists() else []
            reasons[cell.id] = f"failed: {lines[-1]}" if lines else "not run or not finished"
    return reasons


def _describe(sweep: Sweep) -> dict[str, Any]:
    from hybrid_jax.config import to_dict

    return {"name": sweep.name, "description": sweep.description,
            "data": to_dict(sweep.data), "family": dataclasses.asdict(sweep.family),
            "architectures": sweep.architectures, "budgets": sweep.budgets,
            "learning_rates": sweep.learning_rates, "seeds": sweep.seeds,
            "train": to_dict(sweep.train), "eval_variants": sweep.eval_variants}
