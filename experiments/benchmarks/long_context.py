"""Long context on one device, context parallelism off: the largest T (a power of two) whose
train step fits and runs, and tokens/s at T = 8k / 32k / 128k where they fit.

    python -m experiments.benchmarks.long_context [--models nha-340m,gdn-340m,transformer-350m]
        [--lengths 8192,32768,131072] [--max-length 1048576] [--probe-limit 60]
        [--budget 200] [--out long_context.json]

Every model: batch 1, bf16 compute with float32 parameters and AdamW state, `remat="full"`,
`scan_layers=True`, random tokens (one document per row), the trainer's own
`init_train_state` / `make_train_step` (donated state). A probe at T compiles the step and,
when the compiled step (XLA's memory analysis: arguments + outputs + temporaries − donated)
fits in the device's memory, runs it: one step, or two with the second timed when the step is
predicted short (< 2 s) or unknown (the first probe). Out of memory is the compiled step
needing more than the device holds, or an allocation failing when it runs.

Probes: the `--lengths` upwards, then doubling up to `--max-length`; the first out-of-memory
T ends the climb, and the powers of two between the last T that fit and it are bisected
(halving down to 1024 when the first length fails already). A probe is not run, and says why,
when its predicted step (the last step's time scaled by `hybrid_jax.flops`' count) exceeds
`--probe-limit` seconds (then it is only compiled: it fits or not) or the model's share of
`--budget` is spent. Each model runs in its own process (killed at the end of its share,
keeping the rows it printed), so the whole command ends in about `--budget` seconds plus
start-up, with whatever was skipped printed.

Prints a Markdown table per question (for BENCHMARKS.md) and writes the JSON. The driver never
touches the device (the children do, one at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph

MODELS = "nha-340m,gdn-340m,transformer-350m"
LENGTHS = "8192,32768,131072"
MIN_LENGTH = 1024  # the shortest probe when even the first length fails
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "OOM")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


# --- one model, in its own process -------------------------------------------------------------


class Prober:
    """Probes one model: a host copy of its initial state, put on the device for each probe."""

    def __init__(self, name: str):
        import jax

        from hybrid_jax import presets
        from hybrid_jax.config import ExperimentConfig, MeshConfig, TrainConfig
        from hybrid_jax.data.mqar import MQARConfig
        from hybrid_jax.nn.lm import count_params
        from hybrid_jax.sharding import make_mesh
        from hybrid_jax.train.trainer import init_train_state

        self.name = name
        self.config = presets.get(name).replace(dtype="bfloat16", param_dtype="float32",
                                                remat="full", scan_layers=True)
        # The probes feed their own batches; the data config only has to be a valid one.
        experiment = ExperimentConfig(name=name, model=self.config, data=MQARConfig(),
                                      train=TrainConfig(batch_size=1, steps=100,
                                                        warmup_steps=10))
        self.mesh = make_mesh(MeshConfig(), jax.devices()[:1])
        self.ts = init_train_state(experiment, self.mesh)
        self.params = count_params(self.ts.model())
        self.host_state = jax.device_get(self.ts.state)
        self.ts.state = None  # the device holds only the probe's state
        stats = jax.devices()[0].memory_stats() or {}
        self.limit_gib = stats.get("bytes_limit", 0) / 2**30 or None
        self.last: dict[str, Any] | None = None  # the last probe that ran

    def flops(self, length: int) -> float:
        from flax import nnx

        from hybrid_jax.flops import step_flops

        params = nnx.filter_state(self.host_state[0], nnx.Param)  # no second trace
        return step_flops(self.config, length, params).training_per_token() * length

    def predicted_step_s(self, length: int) -> float | None:
        if self.last is None:
            return None
        return self.last["step_s"] * self.flops(length) / self.flops(self.last["T"])

    def probe(self, length: int, probe_limit: float) -> dict[str, Any]:
        import jax
        import numpy as np

        from experiments.benchmarks.timing import error_text
        from hybrid_jax.train.trainer import make_train_step, to_device

        row: dict[str, Any] = {"model": self.name, "params_M": self.params / 1e6, "T": length}
        state = None
        try:
            tokens = np.random.default_rng(length).integers(
                0, self.config.vocab_size, (1, length + 1)).astype(np.int32)
            batch = to_device({"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                               "mask": np.ones((1, length), bool)}, self.mesh)
            start = time.perf_counter()
            abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                      sharding=s),
                                    self.host_state, self.ts.shardings)
            with jax.set_mesh(self.mesh):
                step = make_train_step(self.ts).lower(abstract, batch).compile()
            row["compile_s"] = time.perf_counter() - start
            memory = step.memory_analysis()
            if memory is not None:
                row["mem_GiB"] = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                                  + memory.temp_size_in_bytes
                                  - memory.alias_size_in_bytes) / 2**30
            if self.limit_gib and row.get("mem_GiB", 0) > self.limit_gib:
                row["oom"] = (f"the compiled step needs {row['mem_GiB']:.1f} GiB, the device "
                              f"holds {self.limit_gib:.1f}")
                return row
            predicted = self.predicted_step_s(length)
            if predicted is not None and predicted > probe_limit:
                row["not_run"] = (f"fits; predicted step {predicted:.0f} s > --probe-limit "
                                  f"{probe_limit:g} s")
                return row
            state = jax.device_put(self.host_state, self.ts.shardings)
            runs = 2 if predicted is None or predicted < 2.0 else 1
            with jax.set_mesh(self.mesh):
                for _ in range(runs):
                    start = time.perf_counter()
                    state, metrics = step(state, batch)
                    loss = float(metrics["loss"])
                    row["step_s"] = time.perf_counter() - start
            row.update(tokens_per_s=length / row["step_s"], loss=loss, timed_steps=runs,
                       tflops=self.flops(length) / row["step_s"] / 1e12)
            self.last = row
        except Exception as e:  # noqa: BLE001  (out of memory and the like: report, go on)
            text = error_text(e, 200)
            row["oom" if any(m in str(e) for m in OOM_MARKERS) else "error"] = text
        finally:
            del state
        return row


def probe_lengths(prober: Prober, args, deadline: float) -> None:
    """The climb and the bisection (module docstring); one JSON line per probe or skip."""
    climb = sorted(_ints(args.lengths))
    while climb[-1] * 2 <= args.max_length:
        climb.append(climb[-1] * 2)
    fitted, failed, queue = 0, None, list(climb)
    while queue:
        length = queue.pop(0)
        predicted = prober.predicted_step_s(length) or 0.0
        compile_s = prober.last["compile_s"] if prober.last else 30.0
        if time.time() + compile_s + min(predicted, args.probe_limit) > deadline:
            for skipped in [length, *queue]:
                print(json.dumps({"model": prober.name, "T": skipped,
                                  "skipped": "the model's share of --budget is spent"}),
                      flush=True)
            return
        row = prober.probe(length, args.probe_limit)
        print(json.dumps(row), flush=True)
        if "step_s" in row or "not_run" in row:  # it fits
            fitted = max(fitted, length)
        else:
            failed = length if failed is None else min(failed, length)
        if failed is not None and not fitted:  # nothing fits yet: halve (down to 1024)
            queue = [failed // 2] if failed // 2 >= MIN_LENGTH else []
        elif failed is not None:  # bisect the powers of two between the last fit and failure
            between = _powers_between(fitted, failed)
            queue = [between[len(between) // 2]] if between else []


def _powers_between(low: int, high: int) -> list[int]:
    """The powers of two strictly between `low` and `high`."""
    out, t = [], 1
    while t < high:
        if t > low:
            out.append(t)
        t *= 2
    return out


def child(args) -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # before jax starts
    prober = Prober(args.child)
    import jax

    device = jax.devices()[0]
    print(json.dumps({"model": args.child, "params_M": prober.params / 1e6,
                      "device": f"{device.device_kind} (jax {jax.__version__})",
                      "device_GiB": prober.limit_gib}), flush=True)
    probe_lengths(prober, args, args.deadline)


# --- the driver: one child per model, then the tables -----------------------------------------


def run_child(name: str, args, share: float) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "experiments.benchmarks.long_context", "--child", name,
               "--deadline", str(time.time() + share - 5), "--lengths", args.lengths,
               "--max-length", str(args.max_length), "--probe-limit", str(args.probe_limit)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        out, err = process.communicate(timeout=share + 10)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        print(f"{name}: killed at the end of its {share:.0f} s share", flush=True)
    # The child's own library records (which rung ran and why) would go with its captured
    # stderr: pass them on.
    for line in err.splitlines():
        if line.startswith("hybrid_jax."):
            print(f"{name}: {line}", file=sys.stderr, flush=True)
    rows = []
    for line in out.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if process.returncode not in (0, None) and not rows[1:]:
        print(f"{name}: exited {process.returncode}: {err[-800:]}", flush=True)
    return rows


def summarise(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [r["T"] for r in rows if "step_s" in r]
    fits = [r["T"] for r in rows if "not_run" in r]
    failed = [r for r in rows if "oom" in r or "error" in r]
    skipped = [r for r in rows if "skipped" in r or "not_run" in r]
    first_failure = min(failed, key=lambda r: r["T"]) if failed else None
    params = next((r["params_M"] for r in rows if "params_M" in r), None)
    largest = max(ran, default=None)
    memory = next((r.get("mem_GiB") for r in rows if r.get("T") == largest), None)
    if first_failure is not None:
        limit = "out of memory" if "oom" in first_failure else "error"
    else:
        limit = "time / --max-length"
    return {"model": name, "params_M": params, "largest_T_trained": largest,
            "largest_T_compiled_fits": max(fits, default=None),
            "first_T_failed": None if first_failure is None else first_failure["T"],
            "limited_by": limit, "mem_GiB_at_largest": memory,
            "failure": None if first_failure is None else first_failure.get(
                "oom", first_failure.get("error")),
            "not_probed": [f"T={r['T']}: {r.get('skipped') or r.get('not_run')}"
                           for r in skipped]}


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--lengths", default=LENGTHS)
    parser.add_argument("--max-length", type=int, default=1 << 20)
    parser.add_argument("--probe-limit", type=float, default=60.0,
                        help="seconds; a probe whose step would take longer is only compiled")
    parser.add_argument("--budget", type=float, default=200.0,
                        help="seconds for all models; each gets an equal share of what is left")
    parser.add_argument("--out", default="long_context.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from experiments.benchmarks.timing import markdown_table, print_table  # (no device use)

    names = [n for n in args.models.split(",") if n]
    end, rows, summaries = time.time() + args.budget, [], []
    for i, name in enumerate(names):
        share = (end - time.time()) / (len(names) - i)
        if share < 20:
            print(f"{name}: skipped, {share:.0f} s of the budget left", flush=True)
            summaries.append({"model": name, "limited_by": "not run (budget)"})
            continue
        own = run_child(name, args, share)
        rows.extend(own)
        summaries.append(summarise(name, own))
    probes = [r for r in rows if "T" in r]
    print_table(probes, ["model", "T", "compile_s", "mem_GiB", "step_s", "tokens_per_s",
                         "tflops", "oom", "not_run", "skipped", "error"])
    lengths = _ints(args.lengths)
    speed = [r for r in probes if r["T"] in lengths and "tokens_per_s" in r]
    largest_columns = ["model", "params_M", "largest_T_trained", "first_T_failed", "limited_by",
                       "mem_GiB_at_largest", "largest_T_compiled_fits"]
    print("\nLargest T that trains (bf16, remat full, batch 1, one device, no context "
          "parallelism):\n")
    print(markdown_table(summaries, largest_columns))
    print("\nTokens/s at the lengths that fit:\n")
    print(markdown_table(speed, ["model", "T", "tokens_per_s", "step_s", "tflops", "mem_GiB",
                                 "compile_s"]))
    for summary in summaries:
        for line in summary.get("not_probed", []):
            print(f"not probed: {summary['model']} {line}")
        if summary.get("failure"):
            print(f"failure: {summary['model']} T={summary['first_T_failed']}: "
                  f"{summary['failure']}")
    device = next((r["device"] for r in rows if "device" in r), None)
    record = dict(benchmark="long_context", device=device, date=time.strftime("%Y-%m-%d"),
                  command=" ".join(sys.argv), lengths=lengths, probe_limit_s=args.probe_limit,
                  budget_s=args.budget, summaries=summaries, rows=probes)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_with_logging(main)
