"""RMSNorm and the gated RMSNorm: the Pallas kernels against the XLA rung (every block's norms,
Gated DeltaNet's and Mamba-2's output norms).

    python -m experiments.benchmarks.rms_norm [--parts check,table] [--batch 4]
        [--length 8192] [--variants LABELS] [--budget-s 120] [--interpret] [--out rms_norm.json]

bf16 x, z and dy, float32 γ (as the models keep them), rows = batch × length tokens. Shapes
(`SHAPES`): C = 1024 in one group (transformer-350m's d_model: its pre-norms) and C = 1536 in
groups of 512 (gdn-340m's output norm: 3 heads of 512 values, `[B, T, 3, 512]` normed per
head, the same memory as [B·T, 1536] in groups of 512), and C = 2048 in one group
(mamba2-340m's output norm: 32 heads of 64 values, one group). Forms: plain `n(x)·γ` (over all
C channels), gated `n(x)·γ·silu(z)` (GDN), gated inside `n(x·silu(z))·γ` (Mamba-2). Parts, in
order:
  check  bf16 kernels vs the float32 XLA rung on the same (upcast) inputs at the real shapes
         and an odd row count: y and the gradients of x, z, γ (relative error ‖a − b‖ / ‖b‖,
         each < 1e-2)
  table  fwd and fwd+bwd ms of the xla and pallas rungs (`hybrid_jax.ops.rms_norm` /
         `gated_rms_norm`) at [B·T, C], plain and gated; the HBM floor of each (bytes /
         4.3 TB/s: fwd reads x (and z) and writes y; fwd+bwd also reads x, (z), dy and writes
         dx, (dz)) and the ratio to it; `--variants` adds pallas rows at other tiles and
         launch parameters (`VARIANTS`, ';'-separated labels or all)
The cotangent of fwd+bwd is a random array (a constant one would let XLA fold dy away).
Rows left when --budget-s is spent are reported as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import (
    CALLS,
    HBM_TB_S,
    device_name,
    error_text,
    floor_columns,
    measure_into,
    parse_labels,
    print_table,
    relative_error,
    run_parts,
    time_compiled,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.ops.norms import gated_rms_norm, rms_norm
from pallas_kernels.rms_norm import api
from pallas_kernels.rms_norm.block_sizes import BlockSizes, default_block_sizes

TOLERANCE = 1e-2
EPS = 1e-6
# C, group, model, the forms the table times
SHAPES = ((1024, 1024, "transformer-350m", ("plain", "gated")),
          (1536, 512, "gdn-340m", ("plain", "gated")),
          (2048, 2048, "mamba2-340m", ("gated_inside",)))
FORMS = {"plain": None, "gated": True, "gated_inside": False}  # → norm_before_gate


# Changes to `default_block_sizes(group)` timed beside it (session 16: the backward of
# mamba2-340m's norm ran at 2.2× its HBM floor in the train step). Tiles are rows; a tile's
# elements are rows × the group (2048 at Mamba-2: 2 backward rows are 4096 elements).
VARIANTS = {
    "backward rows x2": lambda b: dict(backward_block_rows=2 * b.backward_block_rows),
    "backward rows x2, 4 steps": lambda b: dict(backward_block_rows=2 * b.backward_block_rows,
                                                backward_steps=4),
    "backward 4 warps": lambda b: dict(backward_num_warps=4),
    "backward 16 warps": lambda b: dict(backward_num_warps=16),
    "backward 3 stages": lambda b: dict(backward_num_stages=3),
    "backward 1 stage": lambda b: dict(backward_num_stages=1),
    "backward 64 steps": lambda b: dict(backward_steps=64),
    "forward rows x2": lambda b: dict(block_rows=2 * b.block_rows),
    "forward 4 warps": lambda b: dict(num_warps=4),
    # Session 18 (NOTES.md, "Session 18"; the default since: half session 16's rows over
    # twice the steps, 8 warps, joint sums): its timed alternatives, relative to it now.
    # 'backward 4 warps, prefetch' was session 18's 'backward 4 warps, rows /2, joint sums,
    # prefetch' (s18c: 0.357 ms at Mamba-2's norm, 0.277 at GDN's gated, 0.189 plain 1536)
    "backward separate sums": lambda b: dict(backward_joint_sums=False),
    "backward prefetch": lambda b: dict(backward_prefetch=True),
    "backward 4 warps, prefetch": lambda b: dict(backward_num_warps=4, backward_prefetch=True),
    # 1 row a step at Mamba-2's C 2048: 781 programs, 2 whole waves at 3 programs an SM (32
    # steps: 1024 programs, 2.6 waves; s18c: 0.387 against 0.382 ms)
    "backward 42 steps": lambda b: dict(backward_steps=42),
}

INTERPRET = {"on": False}


def parse_variants(text: str) -> list[str]:
    """`--variants`: none, all, or ';'-separated labels of `VARIANTS`."""
    return parse_labels(text, list(VARIANTS))


def variant_blocks(label: str | None, group: int, form: str) -> BlockSizes | None:
    """The kernels' tiles of `VARIANTS[label]` for this group and form (None: the rung's own
    defaults)."""
    if label is None:
        return None
    base = default_block_sizes(group, form != "plain")
    return dataclasses.replace(base, **VARIANTS[label](base))


def make_inputs(rows, channels, seed=0):
    """x, z, dy bf16 values (float32 arrays) and float32 γ around 1."""
    keys = iter(jax.random.split(jax.random.key(seed), 4))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    bf16 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
    return (bf16(normal(rows, channels)), bf16(normal(rows, channels)),
            1.0 + 0.1 * normal(channels), bf16(normal(rows, channels)))


def norm(impl: str, form: str, group: int, blocks: BlockSizes | None = None):
    """`(x, z, γ) -> y`: the op's rung `impl` (the plain form: over all channels, z unused), or
    the kernels themselves at `blocks` or in interpret mode (CPU smoke)."""
    before = FORMS[form]
    if impl == "pallas" and (INTERPRET["on"] or blocks is not None):
        return lambda x, z, g: api.rms_norm(x, g, None if before is None else z,
                                            group_size=None if before is None else group,
                                            norm_before_gate=bool(before), eps=EPS,
                                            block_sizes=blocks, interpret=INTERPRET["on"])
    if before is None:
        return lambda x, z, g: rms_norm(x, g, eps=EPS, implementation=impl)
    return lambda x, z, g: gated_rms_norm(x, z, g, group_size=group, norm_before_gate=before,
                                          eps=EPS, implementation=impl)


def fwd_and_vjp(fn, form: str):
    """Jitted forward, and forward + VJP with the given cotangent: (y, (dx, [dz,] dγ)). y is
    returned so that the forward runs (the kernels' VJP keeps only the inputs)."""
    gated = FORMS[form] is not None

    def grads(x, z, g, dy):
        if gated:
            y, vjp = jax.vjp(fn, x, z, g)
            return y, vjp(dy)
        y, vjp = jax.vjp(lambda x, g: fn(x, None, g), x, g)
        dx, dg = vjp(dy)
        return y, (dx, None, dg)

    return jax.jit(fn), jax.jit(grads)


def part_check(args) -> list[dict]:
    rows = []
    cases = [(args.batch * args.length, c, g, f, None) for c, g, _, _ in SHAPES for f in FORMS]
    odd = args.batch * args.length // 8 + 3
    cases.append((odd, 2048, 2048, "gated_inside", None))
    # each `--variants` label at the odd row count, Mamba-2's form and GDN's
    cases += [(odd, c, g, f, label) for label in args.variants
              for c, g, f in ((2048, 2048, "gated_inside"), (1536, 512, "gated"))]
    for n, channels, group, form, label in cases:
        group = channels if form == "plain" else group
        blocks = variant_blocks(label, group, form)
        row = dict(rows=n, C=channels, group=group, form=form, variant=label or "-",
                   passed=False)
        x, z, g, dy = make_inputs(n, channels, seed=n + channels)
        outs = {}
        try:
            for impl, dtype in (("pallas", jnp.bfloat16), ("xla", jnp.float32)):
                _, grads = fwd_and_vjp(norm(impl, form, group, blocks), form)
                y, dxzg = grads(x.astype(dtype), z.astype(dtype), g, dy.astype(dtype))
                outs[impl] = (y, *dxzg)
        except Exception as e:  # noqa: BLE001  (a kernel that does not compile: report)
            row["error"] = error_text(e)
        else:
            for name, got, want in zip(("y", "dx", "dz", "dg"), outs["pallas"], outs["xla"],
                                       strict=True):
                if want is not None:
                    row[name] = relative_error(got, want)
            row["passed"] = all(row[k] < TOLERANCE for k in ("y", "dx", "dz", "dg") if k in row)
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["rows", "C", "group", "form", "variant", "y", "dx", "dz", "dg", "passed",
                       "error"])
    print("check:", "PASS" if all(r["passed"] for r in rows) else "FAIL",
          f"(every error < {TOLERANCE})", flush=True)
    return rows


def floor_ms(rows, channels, gated: bool, backward: bool) -> float:
    """HBM floor, bf16 (2 bytes an element): fwd reads x (and z), writes y; the backward also
    reads x, (z), dy and writes dx, (dz). γ and the dγ partial sums are ≤ 1 %, left out."""
    arrays = (3 if gated else 2) + ((5 if gated else 3) if backward else 0)
    return 2 * arrays * rows * channels / (HBM_TB_S * 1e12) * 1e3


def _time_pair(impl: str, form: str, group: int, x, z, g, dy, blocks=None) -> dict:
    fwd, grads = fwd_and_vjp(norm(impl, form, group, blocks), form)
    return {"fwd_ms": time_compiled(fwd, x, z, g, calls=CALLS),
            "fwd_bwd_ms": time_compiled(grads, x, z, g, dy, calls=CALLS)}


def part_table(args) -> list[dict]:
    rows = []
    n = args.batch * args.length
    for channels, shape_group, model, forms in SHAPES:
        x, z, g, dy = (a.astype(jnp.bfloat16) if a.ndim == 2 else a
                       for a in make_inputs(n, channels))
        for form in forms:
            group = channels if form == "plain" else shape_group
            runs = [("xla", None), ("pallas", None)] + [
                (f"pallas ({label})", variant_blocks(label, group, form))
                for label in args.variants]
            for impl, blocks in runs:
                row = dict(C=channels, group=group, model=model, form=form, impl=impl)
                measure_into(row, args.deadline, _time_pair, impl.split(" ")[0], form, group,
                             x, z, g, dy, blocks)
                floor_columns(row, {part: floor_ms(n, channels, form != "plain", backward)
                                    for part, backward in (("fwd", False), ("fwd_bwd", True))})
                rows.append(row)
                print(row, flush=True)
    for row in rows:  # the kernels' speed-up over the xla rung, on the pallas rows
        xla = next(r for r in rows if (r["C"], r["form"]) == (row["C"], row["form"]))
        if row["impl"].startswith("pallas") and "fwd_ms" in row and "fwd_ms" in xla:
            row["fwd_speedup"] = xla["fwd_ms"] / row["fwd_ms"]
            row["fwd_bwd_speedup"] = xla["fwd_bwd_ms"] / row["fwd_bwd_ms"]
    print_table(rows, ["C", "group", "model", "form", "impl", "fwd_ms", "fwd_bwd_ms",
                       "fwd_floor_ms", "fwd_bwd_floor_ms", "fwd_x_floor", "fwd_bwd_x_floor",
                       "fwd_speedup", "fwd_bwd_speedup", "error"])
    print(f"[{args.batch}·{args.length}, C] bf16, float32 γ; gated: n(x)·γ·silu(z); floor: HBM "
          f"bytes / {HBM_TB_S} TB/s", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--parts", default="check,table")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--budget-s", type=float, default=120,
                        help="table rows left after this long are skipped")
    parser.add_argument("--interpret", action="store_true",
                        help="kernels in interpret mode: a CPU smoke run (small --length)")
    parser.add_argument("--variants", default="none",
                        help=f"table rows at other block sizes: none, all or ';'-separated "
                             f"labels of {list(VARIANTS)}")
    parser.add_argument("--out", default="rms_norm.json")
    args = parser.parse_args()
    try:
        args.variants = parse_variants(args.variants)
    except ValueError as e:
        parser.error(str(e))
    INTERPRET["on"] = args.interpret
    args.deadline = time.perf_counter() + args.budget_s
    print(device_name(), flush=True)
    run_parts({"check": part_check, "table": part_table}, args.parts, args, args.out,
              "rms_norm", batch=args.batch, length=args.length)


if __name__ == "__main__":
    run_with_logging(main)
