"""The two numbers of every Pallas kernel an op launches, read from its jaxpr: the bytes each
kernel must move (its inputs read once, its outputs written once) and the FLOPs of its
products, with the floors they give. Runs on the CPU (the GPU's kernels traced, not run).

    python -m experiments.benchmarks.kernel_traffic [--ops ssd,gated_delta_rule,
        gated_slot_attention,native_hybrid_attention] [--shape 4x8192] [--window 512]
        [--documents MEDIAN] [--platform gpu] [--tflops 800] [--tbs 4.3] [--out F.json]

The inputs, shapes and rungs are `op_kernels`' (its `--shape` forms: `4x8192`,
`gdn-340m@4x8192`, ...). Per op, the forward and the fwd+bwd (gradient of a sum w.r.t. every
input) are traced for `--platform` (`dispatch_audit.traced_for`: the dispatcher and the
kernels' own checks take the GPU's or TPU's path) and every `pallas_call` in the jaxpr gives a
row: its name (the kernel's name in a profile, so `op_kernels` puts these numbers beside the
kernels' times), launches, programs (the grid), GB in / out, GFLOP of its `dot_general`s
(each as 2·M·N·K, times the grid and the trip counts of static loops; a loop whose length is
known only at run time, e.g. a causal kernel's, is counted once and flagged; a branch, at
its costliest: a kernel that skips its work at run time, as NHA's exact path does on
fast-path chunks, is counted as if it ran), and the floors max(GFLOP / `--tflops`, GB /
`--tbs`) in ms. What this does not count: re-reads of a block by several programs (L2 serves
most), spills, and the exponentials and other elementwise work. (NHA's slot kernels at B4
T8192 with documents come out as `pallas_kernels/nha/NOTES.md` "Session 29" counted them by
hand, 11.64 GB.)
Write the two numbers down before a kernel change (the project's rule); `op_kernels` then
says how far from them each kernel runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from experiments.benchmarks.mixer_shapes import shape_jobs
from experiments.benchmarks.timing import HBM_TB_S, forward_and_backward, write_json
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph

MATMUL_TFLOPS = 800.0  # bf16 dense products measured on the H200 (BENCHMARKS.md)


@dataclasses.dataclass
class Kernel:
    """One kernel's launches in a traced call: its compulsory traffic and product FLOPs."""

    name: str
    launches: int = 0
    programs: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    flops: float = 0.0
    dynamic_loops: bool = False

    def floor_ms(self, tflops: float, tb_s: float) -> float:
        return max(self.flops / (tflops * 1e9), (self.bytes_in + self.bytes_out) / (tb_s * 1e9))

    def row(self, tflops: float, tb_s: float) -> dict[str, Any]:
        return {"kernel": self.name, "launches": self.launches, "programs": self.programs,
                "GB_in": self.bytes_in / 1e9, "GB_out": self.bytes_out / 1e9,
                "GFLOP": self.flops / 1e9, "dynamic_loops": self.dynamic_loops,
                "floor_ms": self.floor_ms(tflops, tb_s)}


def kernels(fn: Callable, *inputs: Any) -> list[Kernel]:
    """The Pallas kernels of `fn(*inputs)` (arrays or `jax.ShapeDtypeStruct`s), traced on
    the current platform, by name in order of first launch (a name launched at several shapes
    summed)."""
    by_name: dict[str, Kernel] = {}
    for eqn in _pallas_calls(jax.make_jaxpr(fn)(*inputs).jaxpr):
        name = _kernel_name(eqn.params)
        kernel = by_name.setdefault(name, Kernel(name))
        programs = math.prod(eqn.params["grid_mapping"].grid)
        flops, dynamic = _flops(eqn.params["jaxpr"])
        kernel.launches += 1
        kernel.programs += programs
        kernel.bytes_in += sum(_nbytes(v.aval) for v in eqn.invars)
        kernel.bytes_out += sum(_nbytes(v.aval) for v in eqn.outvars)
        kernel.flops += programs * flops
        kernel.dynamic_loops |= dynamic
    return list(by_name.values())


def _kernel_name(params: dict[str, Any]) -> str:
    """The `pallas_call`'s name (`name` in JAX 0.10; `name_and_src_info` in other versions)."""
    return params["name"] if "name" in params else params["name_and_src_info"].name


def _nbytes(aval: Any) -> int:
    return math.prod(aval.shape) * np.dtype(aval.dtype).itemsize


def _sub_jaxprs(eqn: Any) -> Iterator[Any]:
    """The jaxprs nested in an equation's parameters (closed or open, alone or in tuples)."""
    for param in eqn.params.values():
        for item in param if isinstance(param, tuple | list) else (param,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def _pallas_calls(jaxpr: Any) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        else:
            for sub in _sub_jaxprs(eqn):
                yield from _pallas_calls(sub)


def _flops(jaxpr: Any) -> tuple[float, bool]:
    """FLOPs of the `dot_general`s one program runs, and whether a loop of run-time length
    was counted once. Static loops (`scan`, as `fori_loop` with static bounds lowers) count
    their trip count; a `cond`, its costliest branch."""
    total, dynamic = 0.0, False
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
            continue
        subs = [_flops(sub) for sub in _sub_jaxprs(eqn)]
        if not subs:
            continue
        if name == "cond":
            flops = max(f for f, _ in subs)
        else:
            flops = sum(f for f, _ in subs) * (eqn.params["length"] if name == "scan" else 1)
        total += flops
        dynamic |= name == "while" or any(d for _, d in subs)
    return total, dynamic


def _dot_flops(eqn: Any) -> float:
    """2 × (output elements) × (contracted size)."""
    (contracting, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)


def against_time(kernel: Kernel | None, ms: float, tflops: float = MATMUL_TFLOPS,
                 tb_s: float = HBM_TB_S) -> dict[str, Any]:
    """A profiled kernel's rates from its two numbers and its `ms` a call: TB/s of its
    compulsory bytes, TFLOP/s of its products, and its time over its floor (empty for a
    kernel that is not a `pallas_call`: XLA's fusions)."""
    if kernel is None or ms <= 0:
        return {}
    gb, floor = (kernel.bytes_in + kernel.bytes_out) / 1e9, kernel.floor_ms(tflops, tb_s)
    counted = {"GB": gb, "GFLOP": kernel.flops / 1e9, "floor_ms": floor}
    if ms < floor:  # it skipped work at run time (NHA's exact path on fast-path chunks)
        return {**counted, "skipped_work": True}
    return {**counted, "TB_s": gb / ms, "TFLOP_s": kernel.flops / 1e9 / ms,
            "over_floor": ms / floor}


def print_against_time(timed: list[dict[str, Any]], traffic: dict[str, Kernel]) -> None:
    """One line per profiled Pallas kernel (`trace_summary` rows: name, ms_per_step); the
    floors at the H200's rates (`MATMUL_TFLOPS`, `HBM_TB_S`; an H100's copy rate is ≈ 3.35)."""
    for row in timed:
        rates = against_time(traffic.get(row["name"]), row["ms_per_step"])
        if rates.get("skipped_work"):
            print(f"  {row['name'][:44]:44} below its floor {rates['floor_ms']:.3f} ms: it "
                  "skipped work at run time (its numbers count all of it)")
        elif rates:
            print(f"  {row['name'][:44]:44} {rates['GB']:7.3f} GB {rates['TB_s']:5.2f} TB/s "
                  f"{rates['GFLOP']:8.2f} GFLOP {rates['TFLOP_s']:6.1f} TFLOP/s, "
                  f"{rates['over_floor']:5.2f}x its floor {rates['floor_ms']:.3f} ms")


def op_passes(fn: Callable, num_inputs: int) -> dict[str, Callable]:
    """The forward (its first output) and the fwd+bwd, as `op_kernels` profiles them."""
    forward = lambda *a: jax.tree.leaves(fn(*a))[0]  # noqa: E731
    return dict(zip(("fwd", "fwd+bwd"), forward_and_backward(forward, num_inputs), strict=True))


def print_table(kernels_: list[Kernel], tflops: float, tb_s: float) -> None:
    print(f"{'kernel':44} {'launch':>6} {'programs':>9} {'GB in':>7} {'GB out':>7} "
          f"{'GFLOP':>8} {'floor ms':>9}")
    for k in kernels_:
        mark = " (loops of run-time length counted once)" if k.dynamic_loops else ""
        print(f"{k.name[:44]:44} {k.launches:6d} {k.programs:9d} {k.bytes_in / 1e9:7.3f} "
              f"{k.bytes_out / 1e9:7.3f} {k.flops / 1e9:8.2f} {k.floor_ms(tflops, tb_s):9.3f}"
              + mark)
    gb = sum(k.bytes_in + k.bytes_out for k in kernels_) / 1e9
    gflop = sum(k.flops for k in kernels_) / 1e9
    print(f"{'all kernels':44} {'':6} {'':9} {gb:15.3f} {gflop:8.2f} "
          f"{sum(k.floor_ms(tflops, tb_s) for k in kernels_):9.3f}")


def main() -> None:
    # Imported here: dispatch_audit imports the model presets, which this module's library
    # use (`kernels`, from op_kernels on the GPU) does not need.
    from experiments.benchmarks.op_kernels import add_op_arguments, documents, op_and_inputs
    from experiments.dispatch_audit import traced_for

    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    add_op_arguments(parser)
    parser.add_argument("--platform", default="gpu", choices=("gpu", "tpu"))
    parser.add_argument("--tflops", type=float, default=MATMUL_TFLOPS,
                        help="the product rate of the FLOP floor (TFLOP/s)")
    parser.add_argument("--tbs", type=float, default=HBM_TB_S,
                        help="the bandwidth of the byte floor (TB/s)")
    parser.add_argument("--out", default="kernel_traffic.json")
    args = parser.parse_args()
    try:
        jobs, skipped = shape_jobs(args.shape, args.ops.split(","))
    except ValueError as e:
        parser.error(str(e))
    print(f"{args.shape} bf16, impl {args.impl}, traced for {args.platform}; floors at "
          f"{args.tflops:g} TFLOP/s and {args.tbs:g} TB/s", *skipped, sep="\n", flush=True)
    rows = []
    for name, shape in jobs:
        ids = documents(shape, args.documents)
        built = {}

        def inputs(name=name, shape=shape, ids=ids, built=built):
            built["op"], arrays = op_and_inputs(name, shape, args.window, args.impl, ids)
            return arrays

        abstract = jax.eval_shape(inputs)  # nothing allocated
        for label, fn in op_passes(built["op"], len(abstract)).items():
            with traced_for(args.platform):
                found = kernels(fn, *abstract)
            print(f"\n{name} at {shape.label(name)}, {label}")
            print_table(found, args.tflops, args.tbs)
            rows += [{"op": name, **shape.fields(name), "pass": label,
                      **k.row(args.tflops, args.tbs)} for k in found]
    write_json(args.out, "kernel_traffic", rows, shape=args.shape, impl=args.impl,
               window=args.window, documents=args.documents, platform=args.platform,
               tflops=args.tflops, tb_s=args.tbs)


if __name__ == "__main__":
    run_with_logging(main)
