"""Short causal conv: the Pallas kernels against the XLA rung (GDN's and Mamba's q/k/v, x/B/C).

    python -m experiments.benchmarks.short_conv [--parts check,table,sweep]
        [--channels 768,1536,3072] [--batch 4] [--length 8192] [--budget-s 60]
        [--variants c256,u2,...] [--interpret] [--out short_conv.json]

K = 4 taps, SiLU, bias, bf16 x (float32 weights, as the models keep them). Parts, in order:
  check  bf16 kernels vs the float32 XLA rung on the same (upcast) inputs: y and the
         gradients of x, w, b (relative error ‖a − b‖ / ‖b‖, each < 1e-2), packed and not,
         K = 1..4, odd T, channels that are no multiple of the tiles; the kernels with the
         default tiles and with each of --variants
  table  fwd and fwd+bwd ms of the xla and pallas rungs (`hybrid_jax.ops.short_conv`) at
         [B, T, C] for each C, packed (≈ 3 documents a row) and one document a row; the
         HBM floor of each (bytes / 4.3 TB/s: fwd reads x, writes y; fwd+bwd also reads x
         and dy, writes dx) and the ratio to it
  sweep  each kernel alone under tile / warp / stage variants at C = 1536 packed, one knob
         at a time from the defaults (kept where ≥ 2 % faster); prints the fastest
         `BlockSizes` and times the op with them
  variants  each kernel alone and the op's fwd+bwd with the defaults and with each named
         `BlockSizes` of --variants (`VARIANTS`: the streaming backward's tiles), at each C,
         packed and one document a row
The cotangent of fwd+bwd is a random array (a constant one would let XLA fold dy away).
Rows left when --budget-s is spent are reported as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import (
    CALLS,
    HBM_TB_S,
    device_name,
    error_text,
    floor_columns,
    measure_into,
    print_table,
    relative_error,
    run_parts,
    time_compiled,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.ops.short_conv import short_conv
from pallas_kernels.short_conv import api, gpu
from pallas_kernels.short_conv.block_sizes import BlockSizes, default_block_sizes

SIZE = 4
TOLERANCE = 1e-2
CHECKS = (  # batch, length, channels, size, bias, documents
    (2, 4099, 1536, 4, True, True),
    (1, 1001, 320, 3, False, True),
    (2, 777, 200, 2, True, False),
    (1, 515, 768, 1, True, True),
)
SWEEP_CHANNELS = 1536
_DEFAULT = default_block_sizes()
# Named whole-`BlockSizes` variants of the streaming backward (several fields at once, unlike
# the sweep's knobs): session 15's runners-up around the default (4 steps an iteration, 128
# channels on one warp, 64 steps a program).
VARIANTS = {
    "default": _DEFAULT,
    "c256": dataclasses.replace(_DEFAULT, backward_block_c=256, backward_num_warps=2),
    "u2": dataclasses.replace(_DEFAULT, backward_block_t=2, backward_steps=32),
    "s32": dataclasses.replace(_DEFAULT, backward_steps=32),
}
INTERPRET = {"on": False}


def packed_ids(batch: int, length: int, documents: int, seed: int = 0) -> jax.Array:
    """`[B, T]` ids: each row cut at `documents − 1` random places (≈ equal-sized documents
    on average; 1 = one document a row)."""
    rng = np.random.default_rng(seed)
    starts = np.zeros((batch, length), np.int32)
    for row in starts:
        row[rng.choice(np.arange(1, length), documents - 1, replace=False)] = 1
    return jnp.asarray(np.cumsum(starts, axis=1), jnp.int32)


def make_inputs(batch, length, channels, size, seed=0):
    """x, dy bf16 values (float32 arrays) and float32 w, b."""
    keys = iter(jax.random.split(jax.random.key(seed), 4))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    bf16 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
    return (bf16(normal(batch, length, channels)), normal(size, channels) * size ** -0.5,
            normal(channels) * 0.1, bf16(normal(batch, length, channels)))


def conv(impl: str, ids, blocks: BlockSizes | None = None):
    """`(x, w, b) -> y`: the op's rung `impl`, or the kernels in interpret mode (CPU smoke)."""
    if impl == "pallas" and (INTERPRET["on"] or blocks is not None):
        return lambda x, w, b: api.short_conv(x, w, b, segment_ids=ids, activation=True,
                                              block_sizes=blocks, interpret=INTERPRET["on"])
    return lambda x, w, b: short_conv(x, w, b, segment_ids=ids, activation=True,
                                      implementation=impl)


def fwd_and_vjp(fn):
    """Jitted forward, and forward + VJP with the given cotangent: (y, (dx, dw, db)). y is
    returned so that the forward runs (the kernels' VJP keeps only the inputs: with y unused
    the forward kernel would be dead code)."""
    def grads(x, w, b, dy):
        y, vjp = jax.vjp(fn, x, w, b)
        return y, vjp(dy)

    return jax.jit(fn), jax.jit(grads)


def part_check(args) -> list[dict]:
    rows = []
    for (batch, length, channels, size, with_bias, documents), variant in (
            (c, v) for c in CHECKS for v in (None, *args.variants)):
        length = min(length, args.length)  # (a CPU smoke run's short rows)
        row = dict(B=batch, T=length, C=channels, K=size, bias=with_bias, docs=documents,
                   variant=variant or "", passed=False)
        x, w, b, dy = make_inputs(batch, length, channels, size, seed=length)
        b = b if with_bias else None
        ids = packed_ids(batch, length, 7, seed=length) if documents else None
        blocks = VARIANTS[variant] if variant else None
        outs = {}
        try:
            for impl, dtype in (("pallas", jnp.bfloat16), ("xla", jnp.float32)):
                _, grads = fwd_and_vjp(conv(impl, ids, blocks if impl == "pallas" else None))
                y, dxwb = grads(x.astype(dtype), w, b, dy.astype(dtype))
                outs[impl] = (y, *dxwb)
        except Exception as e:  # noqa: BLE001  (a kernel that does not compile: report)
            row["error"] = error_text(e)
        else:
            for name, got, want in zip(("y", "dx", "dw", "db"), outs["pallas"], outs["xla"],
                                       strict=True):
                if want is not None:
                    row[name] = relative_error(got, want)
            row["passed"] = all(row[n] < TOLERANCE for n in ("y", "dx", "dw", "db") if n in row)
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["B", "T", "C", "K", "bias", "docs", "variant", "y", "dx", "dw", "db",
                       "passed", "error"])
    print("check:", "PASS" if all(r["passed"] for r in rows) else "FAIL",
          f"(every error < {TOLERANCE})", flush=True)
    return rows


def floor_ms(batch, length, channels, backward: bool) -> float:
    """HBM floor: bf16 x read and y written (2 + 2 bytes an element), + int32 ids a token;
    the backward also reads x and dy and writes dx (6 bytes) and the ids again."""
    elements, tokens = batch * length * channels, batch * length
    total = 4 * elements + 4 * tokens + (6 * elements + 4 * tokens if backward else 0)
    return total / (HBM_TB_S * 1e12) * 1e3


def _time_pair(fn, x, w, b, dy) -> dict:
    fwd, grads = fwd_and_vjp(fn)
    return {"fwd_ms": time_compiled(fwd, x, w, b, calls=CALLS),
            "fwd_bwd_ms": time_compiled(grads, x, w, b, dy, calls=CALLS)}


def part_table(args) -> list[dict]:
    rows = []
    for channels in args.channels:
        x, w, b, dy = make_inputs(args.batch, args.length, channels, SIZE)
        x, dy = x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16)
        for documents in (3, 1):
            ids = packed_ids(args.batch, args.length, documents) if documents > 1 else None
            for impl in ("xla", "pallas"):
                row = dict(C=channels, docs=documents, impl=impl)
                measure_into(row, args.deadline, _time_pair, conv(impl, ids), x, w, b, dy)
                floor_columns(row, {part: floor_ms(args.batch, args.length, channels, backward)
                                    for part, backward in (("fwd", False), ("fwd_bwd", True))})
                rows.append(row)
                print(row, flush=True)
    for row in rows:  # the kernels' speed-up over the xla rung, on the pallas rows
        xla = next(r for r in rows if r["C"] == row["C"] and r["docs"] == row["docs"])
        if row["impl"] == "pallas" and "fwd_ms" in row and "fwd_ms" in xla:
            row["fwd_speedup"] = xla["fwd_ms"] / row["fwd_ms"]
            row["fwd_bwd_speedup"] = xla["fwd_bwd_ms"] / row["fwd_bwd_ms"]
    print_table(rows, ["C", "docs", "impl", "fwd_ms", "fwd_bwd_ms", "fwd_floor_ms",
                       "fwd_bwd_floor_ms", "fwd_x_floor", "fwd_bwd_x_floor", "fwd_speedup",
                       "fwd_bwd_speedup", "error"])
    print(f"[{args.batch}, {args.length}, C] bf16, K = {SIZE}, SiLU, bias; docs: documents a "
          f"row; floor: HBM bytes / {HBM_TB_S} TB/s", flush=True)
    return rows


# --- sweep -----------------------------------------------------------------------------------

# Likelier winners first: a sweep cut off by the budget keeps those.
FORWARD_KNOBS = dict(block_t=(32, 8), block_c=(64, 256), num_warps=(4, 1))
BACKWARD_KNOBS = dict(backward_block_c=(256, 64), backward_steps=(32, 8),
                      backward_block_t=(2, 8), backward_num_warps=(2, 4),
                      backward_num_stages=(1, 3))


def _kernel_ms(kernel: str, blocks: BlockSizes, x, w, b, ids, dy) -> float:
    st = gpu.Static(size=w.shape[0], activation=True, bias=True, documents=ids is not None,
                    blocks=blocks, interpret=INTERPRET["on"])
    if kernel == "forward":
        return time_compiled(jax.jit(lambda *a: gpu.forward(*a, st)), x, w, b, ids,
                             calls=CALLS)
    return time_compiled(jax.jit(lambda *a: gpu.backward(*a, st)), x, w, b, ids, dy,
                         calls=CALLS)


def part_sweep(args) -> dict:
    """One knob at a time from the defaults, the forward's knobs then the backward's, each
    kept where it is faster; then the whole op with the winners against the defaults."""
    x, w, b, dy = make_inputs(args.batch, args.length, SWEEP_CHANNELS, SIZE)
    x, dy = x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16)
    ids = packed_ids(args.batch, args.length, 3)
    best = default = default_block_sizes()
    rows = []
    for kernel, knobs in (("forward", FORWARD_KNOBS), ("backward", BACKWARD_KNOBS)):
        best_ms = _kernel_ms(kernel, best, x, w, b, ids, dy)
        rows.append(dict(kernel=kernel, variant="default", ms=best_ms))
        print(rows[-1], flush=True)
        for name, values in knobs.items():
            for value in values:
                if time.perf_counter() > args.deadline:
                    break
                blocks = dataclasses.replace(best, **{name: value})
                row = dict(kernel=kernel, variant=f"{name}={value}")
                try:
                    row["ms"] = _kernel_ms(kernel, blocks, x, w, b, ids, dy)
                except Exception as e:  # noqa: BLE001  (a variant that does not compile)
                    row["error"] = error_text(e)
                rows.append(row)
                print(row, flush=True)
                if row.get("ms", float("inf")) < 0.98 * best_ms:  # past timing noise
                    best, best_ms = blocks, row["ms"]
    print_table(rows, ["kernel", "variant", "ms", "error"])
    print(f"best BlockSizes (changed fields): {best.changed()}", flush=True)
    result = dict(rows=rows, best=dataclasses.asdict(best))
    if best != default:  # the whole op with the winners (the defaults' row is the table's)
        result["best_op"] = _time_pair(conv("pallas", ids, best), x, w, b, dy)
        print("the op with the best BlockSizes:", result["best_op"], flush=True)
    return result


def _variant_ms(blocks: BlockSizes, x, w, b, ids, dy) -> dict:
    """Each kernel alone and the op's fwd+bwd with `blocks`."""
    return {"fwd_ms": _kernel_ms("forward", blocks, x, w, b, ids, dy),
            "bwd_ms": _kernel_ms("backward", blocks, x, w, b, ids, dy),
            "fwd_bwd_ms": _time_pair(conv("pallas", ids, blocks), x, w, b, dy)["fwd_bwd_ms"]}


def part_variants(args) -> list[dict]:
    """Each kernel alone and the op's fwd+bwd, with each named `BlockSizes`."""
    rows = []
    for channels in args.channels:
        x, w, b, dy = make_inputs(args.batch, args.length, channels, SIZE)
        x, dy = x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16)
        for documents in (3, 1):
            ids = packed_ids(args.batch, args.length, documents) if documents > 1 else None
            for variant in ("default", *args.variants):
                blocks = VARIANTS[variant]
                row = dict(C=channels, docs=documents, variant=variant)
                measure_into(row, args.deadline, _variant_ms, blocks, x, w, b, ids, dy)
                rows.append(row)
                print(row, flush=True)
    for row in rows:  # against the defaults' row of the same shape
        base = next(r for r in rows if r["C"] == row["C"] and r["docs"] == row["docs"])
        if "bwd_ms" in row and "bwd_ms" in base:
            row["fwd_speedup"] = base["fwd_ms"] / row["fwd_ms"]
            row["bwd_speedup"] = base["bwd_ms"] / row["bwd_ms"]
            row["fwd_bwd_speedup"] = base["fwd_bwd_ms"] / row["fwd_bwd_ms"]
    print_table(rows, ["C", "docs", "variant", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_speedup",
                       "bwd_speedup", "fwd_bwd_speedup", "error"])
    for variant in args.variants:
        print(f"{variant}: {VARIANTS[variant].changed()}", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--parts", default="check,table,sweep")
    parser.add_argument("--channels", default="768,1536,3072")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--budget-s", type=float, default=60,
                        help="rows and sweep variants left after this long are skipped")
    parser.add_argument("--variants", default="",
                        help=f"named BlockSizes for check and variants: {', '.join(VARIANTS)}")
    parser.add_argument("--interpret", action="store_true",
                        help="kernels in interpret mode: a CPU smoke run (small --length)")
    parser.add_argument("--out", default="short_conv.json")
    args = parser.parse_args(argv)
    args.channels = [int(c) for c in args.channels.split(",")]
    args.variants = [v for v in args.variants.split(",") if v and v != "default"]
    for v in args.variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    return args


def main():
    args = parse_args()
    INTERPRET["on"] = args.interpret
    args.deadline = time.perf_counter() + args.budget_s
    print(device_name(), flush=True)
    parts = {"check": part_check, "table": part_table, "sweep": part_sweep,
             "variants": part_variants}
    run_parts(parts, args.parts, args, args.out, "short_conv", batch=args.batch,
              length=args.length, size=SIZE)


if __name__ == "__main__":
    run_with_logging(main)
