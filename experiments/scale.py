"""The scaling study: `hybrid-jax scale EXPERIMENT --devices 1,2,4,8 --strategy data,seq`.

For every strategy and device count it builds the mesh (`data`: batch split, parameters
replicated; `fsdp`: batch split, parameters and optimizer state sharded; `tensor`: heads and
MLP units split; `seq`: time split, the context-parallel mixers), initialises the experiment's
model and optimizer on it, and times a few train steps and forward-only steps on random tokens
(after one compiling step; medians). `--strong` (default) keeps the experiment's global batch;
`--weak` multiplies the work by the device count (the batch for data/fsdp/tensor, the sequence
length for seq).

Columns: tokens/s (train), forward tokens/s, per-device TFLOP/s (train), scaling efficiency
(throughput / (n × throughput of the strategy's smallest device count)), peak memory per
device. FLOPs are XLA's count of the compiled per-device train step (`cost_analysis`), not the
shared analytic counter; memory is the device's peak where the backend reports it, else the
compiled step's arguments + temporaries. On CPU the devices can be fake
(`--xla_force_host_platform_device_count`, set here before jax loads): a plumbing check, not a
measurement of scaling.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STRATEGIES = ("data", "fsdp", "tensor", "seq")


def request_cpu_devices(count: int) -> None:
    """Asks XLA for `count` CPU devices; only effective before jax is first imported."""
    if "jax" in sys.modules or "xla_force_host_platform_device_count" in os.environ.get(
            "XLA_FLAGS", ""):
        return
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={count}").strip()


def parse_list(text: str, what: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--{what}: expected a comma-separated list, got {text!r}")
    bad = [item for item in items if allowed is not None and item not in allowed]
    if bad:
        raise ValueError(f"--{what}: {bad} not in {list(allowed)}")
    return items


def mesh_config(strategy: str, devices: int):
    from hybrid_jax.config import MeshConfig

    sizes = dict(data=1, fsdp=1, seq=1, tensor=1)
    sizes[strategy] = devices
    return MeshConfig(**sizes)


def scaled_experiment(experiment, strategy: str, devices: int, weak: bool):
    """The experiment with its mesh for `strategy` on `devices`, the work scaled when weak."""
    train, data = experiment.train, experiment.data
    if weak and strategy == "seq":
        data = dataclasses.replace(data, seq_len=data.seq_len * devices)
    elif weak:
        train = dataclasses.replace(train, batch_size=train.batch_size * devices)
    train = dataclasses.replace(train, mesh=mesh_config(strategy, devices))
    return dataclasses.replace(experiment, train=train, data=data)


def _peak_bytes(compiled, devices) -> int | None:
    stats = [d.memory_stats() for d in devices]
    if all(s and "peak_bytes_in_use" in s for s in stats):
        return max(s["peak_bytes_in_use"] for s in stats)
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
               + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)


def measure(experiment, strategy: str, devices: int, *, weak: bool, steps: int) -> dict[str, Any]:
    """One row of the table: the timed train and forward steps of one setting."""
    import jax
    import numpy as np

    from experiments.benchmarks.timing import time_compiled
    from hybrid_jax.sharding import make_mesh
    from hybrid_jax.train.trainer import (
        init_train_state,
        make_eval_step,
        make_train_step,
        to_device,
    )

    experiment = scaled_experiment(experiment, strategy, devices, weak)
    mesh = make_mesh(experiment.train.mesh, jax.devices()[:devices])
    batch_size, seq_len = experiment.train.batch_size, experiment.data.seq_len
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, experiment.model.vocab_size, (batch_size, seq_len + 1))
    batch = to_device({"inputs": tokens[:, :-1].astype(np.int32),
                       "targets": tokens[:, 1:].astype(np.int32),
                       "mask": np.ones((batch_size, seq_len), bool)}, mesh)
    ts = init_train_state(experiment, mesh)
    train_step, eval_step = make_train_step(ts), make_eval_step(ts)
    with jax.set_mesh(mesh):
        compiled = train_step.lower(ts.state, batch).compile()
        flops = (compiled.cost_analysis() or {}).get("flops")
        state = ts.state
        start = time.perf_counter()
        state, metrics = train_step(state, batch)
        jax.block_until_ready(metrics)
        compile_s = time.perf_counter() - start

        def train(state):
            return train_step(state, batch)[0]

        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state = jax.block_until_ready(train(state))
            times.append((time.perf_counter() - start) * 1e3)
        train_ms = statistics.median(times)
        forward_ms = time_compiled(eval_step, state, batch, warmup=1, iters=steps)
    tokens_per_step = batch_size * seq_len
    return dict(
        strategy=strategy, devices=devices, batch=batch_size, seq_len=seq_len,
        train_ms=train_ms, forward_ms=forward_ms, compile_s=compile_s,
        tokens_per_s=tokens_per_step / train_ms * 1e3,
        forward_tokens_per_s=tokens_per_step / forward_ms * 1e3,
        tflops_per_device=None if flops is None else flops / train_ms * 1e3 / 1e12,
        peak_mb_per_device=(None if (b := _peak_bytes(compiled, mesh.devices.flat)) is None
                            else b / 2**20),
    )


def add_efficiency(rows: list[dict[str, Any]]) -> None:
    """`efficiency = tokens/s / (n/n₀ × tokens/s at n₀)`, n₀ the strategy's fewest devices."""
    for strategy in {row["strategy"] for row in rows}:
        own = [row for row in rows if row["strategy"] == strategy]
        base = min(own, key=lambda row: row["devices"])
        for row in own:
            ideal = base["tokens_per_s"] * row["devices"] / base["devices"]
            row["efficiency"] = row["tokens_per_s"] / ideal


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    from hybrid_jax.train.plot import new_figure, save_figure

    fig, (left, right) = new_figure(1, 2, figsize=(10, 4))
    for strategy in dict.fromkeys(row["strategy"] for row in rows):
        own = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["devices"])
        devices = [r["devices"] for r in own]
        left.plot(devices, [r["tokens_per_s"] for r in own], marker="o", label=strategy)
        right.plot(devices, [r["efficiency"] for r in own], marker="o", label=strategy)
    for ax, label in ((left, "train tokens/s"), (right, "scaling efficiency")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title)
    return save_figure(fig, path)


COLUMNS = ("strategy", "devices", "batch", "seq_len", "tokens_per_s", "forward_tokens_per_s",
           "tflops_per_device", "efficiency", "peak_mb_per_device", "train_ms", "compile_s")


def run(name: str, devices: Sequence[int], strategies: Sequence[str], *, weak: bool,
        steps: int, out: Path, overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    import jax

    from experiments import registry
    from experiments.benchmarks.timing import device_name, print_table
    from hybrid_jax.config import apply_overrides

    if max(devices) > jax.device_count():
        raise ValueError(f"--devices {max(devices)} but only {jax.device_count()} devices are "
                         "available")
    experiment = apply_overrides(registry.get(name), overrides)
    rows = [measure(experiment, strategy, n, weak=weak, steps=steps)
            for strategy in strategies for n in devices]
    add_efficiency(rows)
    print_table(rows, COLUMNS)
    out.mkdir(parents=True, exist_ok=True)
    mode = "weak" if weak else "strong"
    record = dict(experiment=name, mode=mode, device=device_name(), overrides=list(overrides),
                  date=time.strftime("%Y-%m-%d"), rows=rows)
    (out / "scale.json").write_text(json.dumps(record, indent=2))
    plot(rows, out / "scale.png", f"{name} ({mode} scaling, {device_name()})")
    print(f"wrote {out / 'scale.json'} and {out / 'scale.png'}")
    return rows
