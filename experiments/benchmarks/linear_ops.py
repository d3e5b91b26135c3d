"""Linear-recurrence ops, every rung of ours, against flash-linear-attention (fla) and cuDNN
causal attention, fwd and fwd+bwd, in one run.

    python -m experiments.benchmarks.linear_ops [--parts check,sweep,table]
        [--shapes 4x8192,8x4096,2x16384] [--ops ssd,gated_delta_rule,gated_slot_attention]
        [--impls xla,pallas] [--no-fla] [--fla-timeout SECONDS] [--fla-cache DIR]
        [--time-limit SECONDS] [--out linear_ops.json]

Heads 16, K = V = P = N = 128 (SSD: one B/C group; GSA: 64 slots), bf16 inputs. Parts:
  check  the SSD kernel's GPU accuracy (`ssd_kernel.part_check`)
  sweep  the SSD kernel's tiles at 4 × 8192 (`ssd_kernel.part_sweep`); the table then adds a
         row of the sweep's best
  table  per shape and op: every rung the op has (enumerated through `implementation=`, so a
         new rung appears by itself; "reference" left out; `--impls` keeps some), the SSD
         and GDN kernels' variants (`SSD_VARIANTS`, `GDN_VARIANTS`), fla's chunk kernel (the
         peer script `peers/fla_linear.py`, run in its own process BEFORE JAX takes the GPU)
         and cuDNN causal attention (`jax.nn.dot_product_attention`) at the same
         [B, T, 16, 128]; the ratios ours/fla (fwd, fwd+bwd) and ours/cuDNN (fwd+bwd); then
         the issue's targets.
The fla peer measures the same `--shapes` and `--ops`, in that order, and each of its rows
is kept as it arrives (`peers/stream.py`): at `--fla-timeout` (default: ~90 s per op for the
first shape, fla's autotuning, and 25 s for each further one, within `--time-limit`) it is
stopped and what it finished is used. Every row is printed (flushed) when measured and the
JSON rewritten, so a run stopped from outside keeps its rows too. Rows past `--time-limit`
(seconds for the whole run, the peer included) are skipped (marked so).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments.benchmarks.peers.stream import run_json_lines
from experiments.benchmarks.ssd_kernel import part_check, part_sweep
from experiments.benchmarks.timing import cudnn_op, device_name, measure, print_table, write_json
from hybrid_jax import ops
from hybrid_jax.ops.delta_rule import gated_delta_rule
from hybrid_jax.ops.dispatch import IMPLEMENTATIONS
from hybrid_jax.ops.gsa import gated_slot_attention
from hybrid_jax.ops.ssd import ssd
from pallas_kernels.delta_rule import api as pallas_gdn
from pallas_kernels.delta_rule.block_sizes import default_block_sizes as gdn_block_sizes
from pallas_kernels.ssd import api as pallas_ssd
from pallas_kernels.ssd.block_sizes import BlockSizes

HEADS, DIM, SLOTS = 16, 128, 64
OPS = {
    "ssd": functools.partial(ssd, chunk_size=64),
    "gated_delta_rule": functools.partial(gated_delta_rule, chunk_size=64),
    "gated_slot_attention": gated_slot_attention,
}
# The targets at 4 × 8192 (fwd+bwd unless named): ours ≤ factor × peer time.
TARGETS = {
    "ssd": (("fla", "fwd_ms", 1 / 1.2), ("cudnn", "fwd_bwd_ms", 1.5)),
    "gated_delta_rule": (("fla", "fwd_ms", 1 / 1.2), ("cudnn", "fwd_bwd_ms", 1.5)),
    "gated_slot_attention": (("fla", "fwd_bwd_ms", 1 / 1.2),),
}
# SSD kernel variants timed beside the defaults (the defaults' NOTES say why each is open);
# the default row's sequence segments are automatic (S = 2 at 4 × 8192, 1 at 8 × 4096).
SSD_VARIANTS = {"pallas (grads 2 stages)": BlockSizes(grads_num_stages=2),
                "pallas (split forward)": BlockSizes(split_forward=True),
                **{f"pallas (segments {S})": BlockSizes(segments=S) for S in (1, 2, 4)}}
# Gated delta rule kernel variants (its NOTES.md, Rounds 3 to 6) beside the default (training:
# the outputs split from the state-only sequential pass in V tiles of 32, T inverted block by
# block, the per-chunk gradients split in two kernels at 4 warps; an undifferentiated forward
# keeps the fused pass): a variant's tiles serve both its forward and its fwd+bwd.
_GDN_BASE = gdn_block_sizes(DIM, DIM, 64)
GDN_VARIANTS = {
    f"pallas ({label})": dataclasses.replace(_GDN_BASE, **changes)
    for label, changes in (
        ("fused outputs, V tile 64", dict(split_outputs=False, value_block=64)),
        ("whole-tile inverse", dict(inverse_by_block=False)),
        ("split outputs, V tile 64", dict(value_block=64)),
        ("split outputs, V tile 16", dict(value_block=16)),
        ("sequential 8 warps", dict(state_num_warps=8)),
        ("outputs 8 warps", dict(outputs_num_warps=8)),
        ("split gradients, 8 warps", dict(gradient_num_warps=8)),
        ("split gradients, V tile 128", dict(gradient_value_block=128)))}
COLUMNS = ["op", "impl", "B", "T", "fwd_ms", "fwd_bwd_ms", "vs_fla_fwd", "vs_fla_fwd_bwd",
           "vs_cudnn_fwd_bwd", "temp_MiB", "error"]


def make_inputs(name: str, batch: int, length: int, key: jax.Array) -> tuple:
    keys = iter(jax.random.split(key, 8))
    bf16 = jnp.bfloat16

    def normal(*shape, dtype=bf16):
        return jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)

    bthk = (batch, length, HEADS, DIM)
    if name == "attention":
        return normal(*bthk), normal(*bthk), normal(*bthk)
    if name == "ssd":
        dt = jax.nn.softplus(normal(batch, length, HEADS, dtype=jnp.float32) - 3.0).astype(bf16)
        a = -jnp.exp(jax.random.uniform(next(keys), (HEADS,), jnp.float32, 0.0, 2.7))
        return (normal(*bthk), dt, a, normal(batch, length, 1, DIM), normal(batch, length, 1, DIM))
    if name == "gated_delta_rule":
        q, k = (ops.l2_normalize(normal(*bthk)) for _ in range(2))
        g = -jax.nn.softplus(normal(batch, length, HEADS, dtype=jnp.float32)).astype(bf16)
        beta = jax.nn.sigmoid(normal(batch, length, HEADS, dtype=jnp.float32)).astype(bf16)
        return q, k, normal(*bthk), g, beta
    if name == "gated_slot_attention":
        g = jax.nn.log_sigmoid(normal(batch, length, HEADS, SLOTS, dtype=jnp.float32)) / 8
        s = (1 - jnp.exp(g)).astype(bf16)
        return normal(*bthk), normal(*bthk), normal(*bthk), s, g.astype(bf16)
    raise ValueError(name)


def rungs(name: str, inputs: tuple) -> list[tuple[str, str | None]]:
    """(implementation, None or the reason it refuses this call) for every rung the op has,
    asked through `implementation=` (an unknown name raises 'is not available')."""
    found = []
    for impl in IMPLEMENTATIONS:
        if impl == "reference":  # the per-token definition: not a contender
            continue
        try:
            jax.eval_shape(functools.partial(OPS[name], implementation=impl), *inputs)
            found.append((impl, None))
        except ValueError as e:
            if "is not available" not in str(e):
                found.append((impl, str(e).splitlines()[0][:160]))
    return found


def fla_rows(shapes: str, op_names: str, timeout: float, cache: str | None = None
             ) -> list[dict]:
    """The fla peer in a subprocess (torch must take and free the GPU before JAX): its last
    row per (op, shape), each kept as it arrives, also those before a time-out. `cache`: a
    directory for Triton's kernel and autotuning cache (`TRITON_CACHE_DIR` with
    `TRITON_CACHE_AUTOTUNING=1`), so fla's autotuning — minutes on its first calls, 159 s for
    `chunk_gsa`'s forward alone on the H200 — is paid once and reused by later runs given it."""
    command = [sys.executable, "-m", "experiments.benchmarks.peers.fla_linear", "--shapes",
               shapes, "--ops", op_names]
    env = None if cache is None else {"TRITON_CACHE_DIR": str(Path(cache).resolve()),
                                      "TRITON_CACHE_AUTOTUNING": "1"}
    print(f"fla peer: up to {timeout:.0f} s" + (f", Triton cache {cache}" if cache else ""),
          flush=True)
    lines, failure = run_json_lines(command, timeout, echo="fla peer:", env=env)
    if failure:
        print("fla peer:", failure, flush=True)
    rows = {}
    for row in lines:
        if "op" in row:  # the first line names the versions
            rows[row["op"], row.get("B"), row.get("T")] = row
    for row in rows.values():
        if row.pop("partial", False):
            row["error"] = "fwd+bwd not reached: " + (failure or "peer stopped")
    return list(rows.values()) or [{"op": "*", "impl": "fla",
                                    "error": "fla peer failed: " + (failure or "no rows")}]


def default_fla_timeout(op_names: str, shapes: str) -> float:
    """Seconds for the peer: fla's autotuning on each op's first shape (~a minute on the
    H200), then seconds per further shape; with margin."""
    ops, more = len(op_names.split(",")), len(shapes.split(",")) - 1
    return 90.0 * ops + 25.0 * ops * more


def _ratios(row: dict, fla: dict | None, cudnn: dict | None) -> None:
    pairs = (("vs_fla_fwd", "fwd_ms", fla), ("vs_fla_fwd_bwd", "fwd_bwd_ms", fla),
             ("vs_cudnn_fwd_bwd", "fwd_bwd_ms", cudnn))
    for column, key, peer in pairs:
        if peer and row.get(key) and peer.get(key):
            row[column] = row[key] / peer[key]


def kernel_variants(name: str, tuned=None) -> dict:
    """label → fn(*inputs) of each kernel variant of `name`'s pallas rung timed beside it:
    `SSD_VARIANTS` and the sweep's best (`tuned`), `GDN_VARIANTS`; none for other ops."""
    if name == "ssd":
        variants = dict(SSD_VARIANTS, **({"pallas (sweep best)": tuned} if tuned else {}))
        call = lambda *a, blocks: pallas_ssd.ssd(*a, block_sizes=blocks)[0]
    elif name == "gated_delta_rule":
        variants = GDN_VARIANTS
        call = lambda *a, blocks: pallas_gdn.gated_delta_rule(*a, block_sizes=blocks)[0]
    else:
        return {}
    return {label: functools.partial(call, blocks=blocks) for label, blocks in variants.items()}


def _candidates(name: str, inputs: tuple, impls: set[str] | None, tuned) -> list[tuple]:
    """(label, None or why it is not timed, fn) for each rung of `name` kept by `impls`, and
    when its pallas rung runs, that rung's `kernel_variants`."""
    found = [(impl, reason, functools.partial(OPS[name], implementation=impl))
             for impl, reason in rungs(name, inputs) if impls is None or impl in impls]
    if any(impl == "pallas" and reason is None for impl, reason, _ in found):
        found += [(label, None, fn) for label, fn in kernel_variants(name, tuned).items()]
    return found


def part_table(args, peers: list[dict], tuned, deadline: float, emit) -> list[dict]:
    """The table's rows; `emit(row)` as each is measured (prints it, saves the JSON)."""
    rows = []
    impls = None if args.impls is None else set(args.impls.split(","))

    def add(row):
        rows.append(row)
        emit(row)

    for shape in args.shapes.split(","):
        batch, length = map(int, shape.split("x"))
        base = {"B": batch, "T": length}
        if time.perf_counter() > deadline:
            add({"op": "*", **base, "error": "skipped: time limit"})
            continue
        cudnn = {"op": "attention", "impl": "cudnn causal", **base,
                 **measure(cudnn_op(None), make_inputs("attention", batch, length,
                                                       jax.random.key(0)))}
        add(cudnn)
        for name in args.ops.split(","):
            inputs = make_inputs(name, batch, length, jax.random.key(0))
            fla = next((r for r in peers if (r.get("op"), r.get("B"), r.get("T"))
                        == (name, batch, length)), None)
            for impl, reason, fn in _candidates(name, inputs, impls, tuned):
                row = {"op": name, "impl": impl, **base}
                if reason is not None:
                    row["error"] = "refused: " + reason
                elif time.perf_counter() > deadline:
                    row["error"] = "skipped: time limit"
                else:
                    row.update(measure(fn, inputs))
                _ratios(row, fla, cudnn)
                add(row)
            if fla is not None:
                rows.append({**fla, "op": name, "impl": "fla"})
    print_table(rows, COLUMNS)
    print_targets(rows)
    return rows


def print_targets(rows: list[dict], shape=(4, 8192)) -> None:
    """The issue's targets at 4 × 8192, for the fastest rung of ours per op."""
    at = lambda r: (r.get("B"), r.get("T")) == shape
    cudnn = next((r for r in rows if at(r) and r["op"] == "attention"), None)
    for name, targets in TARGETS.items():
        fla = next((r for r in rows if at(r) and r["op"] == name and r["impl"] == "fla"), None)
        ours = [r for r in rows if at(r) and r["op"] == name and r["impl"] != "fla"
                and "fwd_bwd_ms" in r]
        for peer_name, key, factor in targets:
            peer = cudnn if peer_name == "cudnn" else fla
            best = min(ours, key=lambda r: r[key], default=None)
            if best is None or not peer or not peer.get(key):
                print(f"target {name} {key} vs {peer_name}: not measured")
                continue
            ratio = best[key] / peer[key]
            print(f"target {name} {key}: ours ({best['impl']}) {best[key]:.3g} ms = "
                  f"{ratio:.2f} x {peer_name} {peer[key]:.3g} ms; needs <= {factor:.2f}: "
                  f"{'met' if ratio <= factor else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="table", help="comma-separated: check,sweep,table")
    parser.add_argument("--shapes", default="4x8192,8x4096,2x16384",
                        help="comma-separated BATCHxLENGTH (the targets' 4x8192 first)")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--impls", default=None,
                        help="comma-separated rungs of ours to time (default: every rung)")
    parser.add_argument("--fla", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--fla-timeout", type=float, default=None,
                        help="seconds for the fla peer (default: default_fla_timeout)")
    parser.add_argument("--fla-cache", default=None,
                        help="Triton cache directory for the fla peer (kernels and autotuning "
                             "results; reuse it across runs to skip fla's autotuning)")
    parser.add_argument("--sweep-seconds", type=float, default=110.0)
    parser.add_argument("--time-limit", type=float, default=1e9, help="seconds for the run")
    parser.add_argument("--out", default="linear_ops.json")
    args = parser.parse_args()
    start = time.perf_counter()
    deadline = start + args.time_limit
    parts = args.parts.split(",")
    record = {"command": " ".join(sys.argv), "rows": []}

    def save():
        write_json(args.out, "linear_ops", record["rows"], heads=HEADS, dim=DIM, slots=SLOTS,
                   dtype="bfloat16", quiet=True,
                   **{k: v for k, v in record.items() if k != "rows"})

    def emit(row):
        row["at_s"] = round(time.perf_counter() - start, 1)
        print(row, flush=True)
        record["rows"].append(row)
        save()

    peers = []
    if "table" in parts and args.fla:  # first: torch takes and frees the GPU before JAX
        timeout = args.fla_timeout or default_fla_timeout(args.ops, args.shapes)
        peers = fla_rows(args.shapes, args.ops, min(timeout, args.time_limit), args.fla_cache)
    record["fla"] = peers
    print(device_name(), f"(fla peer done at {time.perf_counter() - start:.0f} s)", flush=True)
    if "check" in parts:
        record["check"] = part_check()
        save()
    tuned = None
    if "sweep" in parts:
        sweep_deadline = min(deadline, time.perf_counter() + args.sweep_seconds)
        record["sweep"], tuned = part_sweep(make_inputs("ssd", 4, 8192, jax.random.key(0)),
                                            sweep_deadline)
        save()
    if "table" in parts:
        record["rows"] = []
        record["rows"] = part_table(args, peers, tuned, deadline, emit)
    print(f"total {time.perf_counter() - start:.0f} s")
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
