"""The scaling study: `hybrid-jax scale EXPERIMENT --devices 1,2,4,8 --strategy data,seq`.

For every model (the experiment's, or each `--model` preset in its place), strategy and device
count it builds the mesh (`data`: batch split, parameters replicated; `fsdp`: batch split,
parameters and optimizer state sharded; `tensor`: heads and MLP units split; `seq`: time split,
the context-parallel mixers), initialises the model and optimizer on it, compiles the trainer's
train step and forward-only (eval) step, and times `steps` of each on random tokens after one
warm-up call (medians). `--strong` (default) keeps the experiment's global batch; `--weak`
multiplies the work by the device count (the batch for data/fsdp/tensor, the sequence length
for seq).

Columns: tokens/s of the train and forward steps; per-device TFLOP/s of both by
`hybrid_jax.flops`' model count (the trainer's `tflops_per_device`: matmuls, attention by its
causal or windowed band, recurrences by their chunked work; `uncounted` names mixers without a
sequence term; the forward step is a third of the train step's), and MFU where the device's
peak is known (`mfu` by 6N, the MFU of record, and `mfu_model`, as the trainer logs them);
scaling efficiency = per-device train TFLOP/s / that of the setting's fewest devices (for
strong scaling and for weak data parallelism the same as tokens/s / (n/n₀ × tokens/s at n₀);
for weak seq it also counts the longer sequences' attention); the peak memory per device of
the compiled train and forward steps (XLA's memory analysis: arguments + outputs +
temporaries − donated buffers); step times and compile time.
`--time-limit` stops starting new settings after that many seconds (the skipped ones are
printed); the JSON is rewritten after every row. On CPU the devices can be fake
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
        from hybrid_jax.registry import did_you_mean

        raise ValueError(f"--{what}: {bad}{did_you_mean(bad[0], allowed)} not in "
                         f"{list(allowed)}")
    return items


def refuse_repeats(what: str, items: Sequence) -> None:
    """A repeated device count, strategy or model measured the same setting twice: two rows
    under one label, and a plot line doubling back on itself."""
    repeated = sorted({str(item) for item in items if list(items).count(item) > 1})
    if repeated:
        raise ValueError(f"--{what}: {repeated} given more than once in "
                         f"{','.join(map(str, items))}")


def mesh_config(mesh, strategy: str, devices: int):
    """`mesh` (its axis rules kept) with every device on the `strategy` axis."""
    sizes = dict(data=1, fsdp=1, seq=1, tensor=1)
    sizes[strategy] = devices
    return dataclasses.replace(mesh, **sizes)


def scaled_experiment(experiment, strategy: str, devices: int, weak: bool):
    """The experiment with its mesh for `strategy` on `devices`, the work scaled when weak."""
    train, data = experiment.train, experiment.data
    if weak and strategy == "seq":
        data = dataclasses.replace(data, seq_len=data.seq_len * devices)
    elif weak:
        train = dataclasses.replace(train, batch_size=train.batch_size * devices)
    train = dataclasses.replace(train, mesh=mesh_config(train.mesh, strategy, devices))
    return dataclasses.replace(experiment, train=train, data=data)


def check_setting(experiment, strategy: str, devices: int, weak: bool) -> None:
    """Refuses a setting whose work the mesh cannot split (before any setting is timed): the
    batch over data / fsdp, the sequence over seq."""
    import jax

    from hybrid_jax.sharding import (
        axis_rules,
        check_batch_split,
        check_seq_split,
        make_mesh,
        use_rules,
    )

    experiment = scaled_experiment(experiment, strategy, devices, weak)
    where = f"{strategy} x{devices}"
    mesh = make_mesh(experiment.train.mesh, jax.devices()[:devices])
    with use_rules(axis_rules(experiment.train.mesh)):  # the batch axes may be overridden
        check_batch_split(mesh, experiment.train.batch_size, f"{where}: train.batch_size")
    check_seq_split(mesh, experiment.data.seq_len, f"{where}: data.seq_len")


def _peak_mb(compiled) -> float | None:
    """The compiled step's peak memory per device (XLA's memory analysis), MiB."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes) / 2**20


def measure(experiment, strategy: str, devices: int, *, weak: bool, steps: int,
            model: str) -> dict[str, Any]:
    """One row of the table: the timed train and forward steps of one setting, parameters and
    activations laid out by the experiment's axis rules (`train.mesh.axis_rules`)."""
    from hybrid_jax.sharding import axis_rules, use_rules

    with use_rules(axis_rules(experiment.train.mesh)):
        return _measure(experiment, strategy, devices, weak=weak, steps=steps, model=model)


def _measure(experiment, strategy: str, devices: int, *, weak: bool, steps: int,
             model: str) -> dict[str, Any]:
    import jax
    import numpy as np

    from experiments.benchmarks.timing import time_compiled
    from hybrid_jax.flops import device_peak_flops, step_flops
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
    with jax.set_mesh(mesh):
        start = time.perf_counter()
        train = make_train_step(ts).lower(ts.state, batch).compile()
        forward = make_eval_step(ts).lower(ts.state, batch).compile()
        compile_s = time.perf_counter() - start
        state, metrics = train(ts.state, batch)  # warm-up
        jax.block_until_ready(metrics)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = train(state, batch)
            jax.block_until_ready(metrics)
            times.append((time.perf_counter() - start) * 1e3)
        train_ms = statistics.median(times)
        forward_ms = time_compiled(forward, state, batch, warmup=1, iters=steps)
    flops = step_flops(experiment.model, seq_len, ts.params)  # no second trace of the init
    tokens_per_step = batch_size * seq_len
    training = flops.training_per_token()  # the model count; one document per row here

    def per_device(flops_per_token: float, ms: float) -> float:  # TFLOP/s per device
        return flops_per_token * tokens_per_step / (ms / 1e3) / devices / 1e12

    row = dict(
        model=model, strategy=strategy, devices=devices, batch=batch_size, seq_len=seq_len,
        train_ms=train_ms, forward_ms=forward_ms, compile_s=compile_s,
        tokens_per_s=tokens_per_step / train_ms * 1e3,
        forward_tokens_per_s=tokens_per_step / forward_ms * 1e3,
        tflops_per_device=per_device(training, train_ms),
        forward_tflops_per_device=per_device(training / 3, forward_ms),
        peak_mb_per_device=_peak_mb(train), forward_peak_mb_per_device=_peak_mb(forward),
        uncounted=",".join(flops.uncounted) or None, loss=float(metrics["loss"]))
    peak = device_peak_flops()  # MFU as the trainer logs it: by 6N (mfu) and the model count
    row["mfu"] = None if peak is None else per_device(flops.six_n, train_ms) * 1e12 / peak
    row["mfu_model"] = None if peak is None else row["tflops_per_device"] * 1e12 / peak
    return row


def add_efficiency(rows: list[dict[str, Any]]) -> None:
    """`efficiency` = per-device train TFLOP/s / that at the fewest devices of the same model
    and strategy (module docstring)."""
    for key in {(row["model"], row["strategy"]) for row in rows}:
        own = [row for row in rows if (row["model"], row["strategy"]) == key]
        base = min(own, key=lambda row: row["devices"])
        for row in own:
            row["efficiency"] = row["tflops_per_device"] / base["tflops_per_device"]


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    from hybrid_jax.train.plot import new_figure, save_figure

    fig, (left, right) = new_figure(1, 2, figsize=(10, 4))
    for key in dict.fromkeys((row["model"], row["strategy"]) for row in rows):
        own = sorted((r for r in rows if (r["model"], r["strategy"]) == key),
                     key=lambda r: r["devices"])
        devices = [r["devices"] for r in own]
        label = f"{key[0]} {key[1]}"
        left.plot(devices, [r["tokens_per_s"] for r in own], marker="o", label=label)
        right.plot(devices, [r["efficiency"] for r in own], marker="o", label=label)
    for ax, label in ((left, "train tokens/s"), (right, "scaling efficiency")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title)
    return save_figure(fig, path)


COLUMNS = ("model", "strategy", "devices", "batch", "seq_len", "tokens_per_s",
           "forward_tokens_per_s", "tflops_per_device", "forward_tflops_per_device", "mfu",
           "mfu_model", "efficiency", "peak_mb_per_device", "forward_peak_mb_per_device",
           "train_ms", "forward_ms", "compile_s")


def experiments_to_run(name: str, models: Sequence[str], overrides: Sequence[str]):
    """`(model label, experiment)` pairs: the experiment (labelled by its name), or one per preset
    in its place; the overrides apply last (so `model.remat=full` reaches a preset too)."""
    from experiments import registry
    from hybrid_jax import presets
    from hybrid_jax.config import apply_overrides

    experiment = registry.get(name)
    if not models:
        return [(name, apply_overrides(experiment, overrides))]
    return [(preset, apply_overrides(dataclasses.replace(experiment, model=presets.get(preset)),
                                     overrides)) for preset in models]


def run(name: str, devices: Sequence[int], strategies: Sequence[str], *, weak: bool,
        steps: int, out: Path, overrides: Sequence[str] = (), models: Sequence[str] = (),
        time_limit: float | None = None) -> list[dict[str, Any]]:
    import jax

    from experiments.benchmarks.timing import device_name, markdown_table, print_table
    from hybrid_jax.files import write_atomic  # here: importing hybrid_jax imports jax

    for what, items in (("devices", devices), ("strategy", strategies), ("model", models)):
        refuse_repeats(what, items)
    if max(devices) > jax.device_count():
        raise ValueError(f"--devices {max(devices)} but only {jax.device_count()} devices are "
                         "available")
    # Fewest devices first: the time limit skips the largest settings, never the base of the
    # efficiency (`--devices 8,4,2,1` measured 1 last, and a skipped 1 made 2 the silent base).
    settings = [(label, experiment, strategy, n)
                for label, experiment in experiments_to_run(name, models, overrides)
                for strategy in strategies for n in sorted(devices)]
    for _, experiment, strategy, n in settings:
        check_setting(experiment, strategy, n, weak)
    out.mkdir(parents=True, exist_ok=True)
    mode = "weak" if weak else "strong"
    record = dict(experiment=name, mode=mode, device=device_name(), overrides=list(overrides),
                  date=time.strftime("%Y-%m-%d"), rows=[], skipped=[])
    start, rows = time.perf_counter(), record["rows"]
    for label, experiment, strategy, n in settings:
        if time_limit is not None and time.perf_counter() - start > time_limit:
            record["skipped"].append(f"{label} {strategy} x{n}")
            print(f"skipped {label} {strategy} x{n}: over the --time-limit of {time_limit:g} s",
                  flush=True)
            continue
        rows.append(measure(experiment, strategy, n, weak=weak, steps=steps, model=label))
        add_efficiency(rows)
        print(json.dumps(rows[-1]), flush=True)
        write_atomic(out / "scale.json", json.dumps(record, indent=2))
    write_atomic(out / "scale.json", json.dumps(record, indent=2))
    print_table(rows, COLUMNS)
    write_atomic(out / "scale.md", markdown_table(rows, COLUMNS) + "\n")
    print(markdown_table(rows, COLUMNS))
    written = [out / "scale.json", out / "scale.md"]
    if rows:
        written.append(plot(rows, out / "scale.png", f"{name} ({mode} scaling, {device_name()})"))
    print("wrote " + ", ".join(str(path) for path in written))
    return rows
