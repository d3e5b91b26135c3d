"""Where a linear-mixer op's time goes on the GPU: its kernels, forward and fwd+bwd, by time.

    python -m experiments.benchmarks.op_kernels [--ops ssd,gated_delta_rule,
        gated_slot_attention,native_hybrid_attention] [--shape 4x8192] [--impl pallas]
        [--window 512] [--top 12] [--variants [LABELS] [--forwards]] [--documents MEDIAN]
        [--skip-d] [--out op_kernels.json]

The inputs of `linear_ops` at `--shape`, in its `--shapes` form (`mixer_shapes`): `4x8192` is
H16, K = V = P = N = 128, GSA/NHA 64 slots; `4x8192x3x256x512` gives H, K, V; `gdn-340m@4x8192`
each op at the preset's layer shape (ops the model does not run are skipped). bf16; NHA at
window `--window`; `--documents 1024` packs documents of log-normal lengths around that
median into each row (segment ids, as in training on packed text); `--skip-d` gives the SSD
Mamba-2's skip D (an `[H]` float32 input, as its layers call it). Each op's jitted forward
and fwd+bwd (gradient of a sum w.r.t. every input) run 3 times under `jax.profiler.trace`;
`trace_summary` sums the device kernels by name.
Prints per op and pass the whole time per call and the top kernels (ms per call, share), and
each Pallas kernel's compulsory bytes and product FLOPs (`kernel_traffic`) with the rates
they give at its time and its time over their floor; writes every kernel row, with its shape
fields, to JSON. `--variants` also profiles the
fwd+bwd of each kernel variant of the op's pallas rung at the shape
(`linear_ops.kernel_variants`), all of them or the ';'-separated labels given, and with
`--forwards` their forwards too (the same as the default's, but for the tiles of a forward
alone, e.g. GDN's 'prepare loads first'), e.g. gdn-340m's mixer: `--ops gated_delta_rule --shape
gdn-340m@4x8192 --variants 'pair gradients pipelined'`. This is the profile to read
before a kernel change (which kernel of the op to make faster), not a timing of record
(`linear_ops` is that).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from experiments.benchmarks import kernel_traffic, trace_summary
from experiments.benchmarks.flash_attention import packed_segments
from experiments.benchmarks.linear_ops import OPS, kernel_variants, make_inputs, parse_variants
from experiments.benchmarks.mixer_shapes import MixerShape, shape_jobs
from experiments.benchmarks.timing import (
    device_name,
    error_text,
    forward_and_backward,
    write_json,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.ops.nha import native_hybrid_attention

RUNS = 3


def op_and_inputs(name: str, shape: MixerShape, window: int, impl: str, segment_ids=None,
                  skip_d: bool = False):
    """The op at its rung `impl` (with `segment_ids` `[B, T]`, or None) and its bf16 inputs
    (`skip_d`: SSD's inputs end in Mamba-2's D `[H]`, float32)."""
    if name == "native_hybrid_attention":
        q, k, v, s, g = make_inputs("gated_slot_attention", shape, jax.random.key(0))
        return functools.partial(native_hybrid_attention, window=window, implementation=impl,
                                 segment_ids=segment_ids), (q, k, v, s, g)
    op = functools.partial(OPS[name], implementation=impl, segment_ids=segment_ids)
    inputs = make_inputs(name, shape, jax.random.key(0))
    if name == "ssd" and skip_d:
        D = jax.random.normal(jax.random.key(1), (shape.heads,), jnp.float32)
        return (lambda *a: op(*a[:5], D=a[5])), (*inputs, D)
    return op, inputs


def documents(shape: MixerShape, median: float):
    """`[B, T]` ids of packed documents of log-normal lengths around `median` (0: None)."""
    return (jnp.asarray(packed_segments(shape.batch, shape.length, median)) if median > 0
            else None)


def profile(fn, inputs) -> dict:
    """Kernel summary of RUNS calls of the compiled `fn(*inputs)`, per call."""
    compiled = jax.jit(fn).lower(*inputs).compile()
    jax.block_until_ready(compiled(*inputs))  # warm-up outside the trace
    return trace_summary.trace_calls(compiled, inputs, RUNS, prefix="op_kernels_")


def add_op_arguments(parser: argparse.ArgumentParser) -> None:
    """The ops, shapes, rung, NHA window and packed documents of a run (`kernel_traffic` takes
    the same)."""
    parser.add_argument("--ops", default="ssd,gated_delta_rule,gated_slot_attention,"
                                         "native_hybrid_attention")
    parser.add_argument("--shape", default="4x8192",
                        help="BxT, BxTxHxK[xV] or MODEL@BxT (`mixer_shapes`)")
    parser.add_argument("--impl", default="pallas")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--documents", type=float, default=0, help="median length of packed "
                        "documents (segment ids, as training on packed text); 0: none")


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    add_op_arguments(parser)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--variants", nargs="?", const="all", default="none",
                        help="also the fwd+bwd of the pallas rung's kernel variants: all (the "
                             "flag alone) or ';'-separated labels")
    parser.add_argument("--forwards", action="store_true",
                        help="also each variant's forward (a variant of a forward-alone tile)")
    parser.add_argument("--skip-d", action="store_true",
                        help="the SSD with Mamba-2's skip D (as mamba2 layers call it)")
    parser.add_argument("--out", default="op_kernels.json")
    args = parser.parse_args()
    try:
        jobs, skipped = shape_jobs(args.shape, args.ops.split(","))
        variants = parse_variants(args.variants)
    except ValueError as e:
        parser.error(str(e))
    rows_of = (f"documents of median {args.documents:g}" if args.documents
               else "one document a row")
    print(device_name(), f"{args.shape} bf16, impl {args.impl}, {rows_of}", *skipped,
          sep="\n", flush=True)
    rows = []
    for name, shape in jobs:
        print(f"\n{name} at {shape.label(name)}")
        ids = documents(shape, args.documents)
        op, inputs = op_and_inputs(name, shape, args.window, args.impl, ids,
                                   skip_d=args.skip_d)
        forward = lambda *a, op=op: jax.tree.leaves(op(*a))[0]
        passes = dict(zip(("fwd", "fwd+bwd"), forward_and_backward(forward, len(inputs)),
                          strict=True))
        if args.impl == "pallas":
            for label, fn in kernel_variants(name, shape, only=variants, segment_ids=ids,
                                             window=args.window).items():
                fwd, fwd_bwd = forward_and_backward(fn, len(inputs))
                if args.forwards:
                    passes[f"fwd {label}"] = fwd
                passes[f"fwd+bwd {label}"] = fwd_bwd
        for label, fn in passes.items():
            try:
                summary = profile(fn, inputs)
            except Exception as e:  # one op failing must not lose the others' rows
                print(f"{name} {label}: {error_text(e, 200)}")
                rows.append({"op": name, **shape.fields(name), "pass": label,
                             "error": str(e)[:300]})
                continue
            traffic = {k.name: k for k in kernel_traffic.kernels(fn, *inputs)}
            print(f"\n{name} {label}: {summary['device_ms_per_step']:.3f} ms of kernels a call")
            trace_summary.print_summary(summary, args.top)
            print("the Pallas kernels against their two numbers (`kernel_traffic`):")
            kernel_traffic.print_against_time(summary["kernels"], traffic)
            rows += [{"op": name, **shape.fields(name), "pass": label, "kernel": r["name"][:120],
                      "ms": r["ms_per_step"], "count": r["count"] // RUNS, "share": r["share"],
                      **kernel_traffic.against_time(traffic.get(r["name"]), r["ms_per_step"])}
                     for r in summary["kernels"]]
    write_json(args.out, "op_kernels", rows, shape=args.shape, impl=args.impl,
               window=args.window, documents=args.documents, skip_d=args.skip_d)


if __name__ == "__main__":
    run_with_logging(main)
