"""Gated delta rule: the Pallas kernels against the XLA chunked rung and cuDNN causal attention.

    python -m experiments.benchmarks.delta_rule_kernel [--check] [--table] [--sweep]
        [--shapes 8x4096,4x8192,2x16384] [--budget-s 190] [--fused-gradients]
        [--variant LABEL] [--out delta_rule_kernel.json]

H16, K = V = 128 (check: also 64/256), bf16 inputs. Parts (all three when none is named):
  check  bf16 kernels (and one float32 case) against the float32 per-token reference on the
         same (upcast) inputs: outputs (also of the forward alone), final state and the
         gradients of q, k, v, g, β and the initial state; relative error ‖a − b‖ / ‖b‖,
         every one must be < 1e-2
  table  fwd and fwd+bwd ms of the pallas and xla rungs (the op, `implementation=`) and cuDNN
         causal attention at the same [B, T, 16, 128] shapes, ratio to cuDNN; one packed row
         (documents of median 1024 tokens) at 4×8192
  sweep  launch variants of the kernels at 4×8192 (V tile, warps, stages, gradient
         tiles), one knob at a time from the defaults; prints the fastest forward and fwd+bwd
Rows left when the time budget is spent are reported as skipped. FLOPs: the chunked work of
`hybrid_jax.flops` (2C(3K + 2V) + C²/3 + 6KV per token and head); fwd+bwd TFLOP/s counts
3.5 × the forward (timing.measure's convention).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.linear_ops import GDN_VARIANTS
from experiments.benchmarks.timing import (
    changed_defaults,
    cudnn_op,
    device_name,
    error_text,
    forward_and_backward,
    measure,
    print_table,
    time_compiled,
    write_json,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax.ops import l2_normalize
from hybrid_jax.ops.delta_rule import gated_delta_rule
from pallas_kernels.delta_rule import api
from pallas_kernels.delta_rule.block_sizes import BlockSizes, default_block_sizes

HEADS, DIM, CHUNK = 16, 128, 64
SWEEP_SHAPE = (4, 8192)
CHECK_CASES = (  # (B, T, H, K, V, dtype, documents)
    (2, 1000, 4, 128, 128, jnp.bfloat16, True),
    (1, 777, 2, 64, 256, jnp.bfloat16, False),
    (1, 700, 2, 64, 64, jnp.bfloat16, True),  # oryx-gdn-340m's heads; 2 programs: V tiles of 16
    (4, 200, 16, 64, 64, jnp.bfloat16, True),  # 64 programs of 64 columns: V tiles of 64 / 32
    (1, 500, 2, 256, 64, jnp.bfloat16, True),
    (1, 300, 2, 256, 512, jnp.bfloat16, True),  # two V slices sharing q and k, V tiles of 32
    (4, 200, 16, 256, 128, jnp.bfloat16, True),  # 128 programs of 64 columns: V tiles of 64
    (1, 300, 2, 128, 128, jnp.float32, True),
)
TOLERANCE = 1e-2
GRAD_NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def make_inputs(batch, length, heads, key_dim, value_dim, key, dtype=jnp.bfloat16):
    keys = iter(jax.random.split(key, 8))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    rows = (batch, length, heads)
    x = dict(q=l2_normalize(normal(*rows, key_dim)), k=l2_normalize(normal(*rows, key_dim)),
             v=normal(*rows, value_dim), g=-jax.nn.softplus(normal(*rows)),
             beta=jax.nn.sigmoid(normal(*rows)))
    x = {name: a.astype(dtype) for name, a in x.items()}
    x["initial_state"] = normal(batch, heads, key_dim, value_dim)
    return x


def packed_segments(batch, length, key, median=1024):
    """Segment ids `[B, T]` of documents with log-normal lengths (median `median`)."""
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    ids = np.zeros((batch, length), np.int32)
    for b in range(batch):
        t, doc = 0, 0
        while t < length:
            size = max(1, int(rng.lognormal(np.log(median), 1.0)))
            ids[b, t:t + size] = doc
            t, doc = t + size, doc + 1
    return jnp.asarray(ids)


def gdn_flops(batch, length, heads=HEADS, key_dim=DIM, value_dim=DIM):
    per_token = 2 * CHUNK * (3 * key_dim + 2 * value_dim) + CHUNK**2 / 3 + 6 * key_dim * value_dim
    return batch * length * heads * per_token


def op(implementation, segment_ids=None):
    """The op's rung as a function of (q, k, v, g, beta)."""
    return lambda q, k, v, g, beta: gated_delta_rule(q, k, v, g, beta, segment_ids=segment_ids,
                                                     implementation=implementation)


def kernel_op(blocks):
    """The kernels with the tiles `blocks`, as a function of (q, k, v, g, beta)."""
    return lambda q, k, v, g, beta: api.gated_delta_rule(q, k, v, g, beta, block_sizes=blocks)[0]


class Budget:
    def __init__(self, seconds):
        self.end = time.perf_counter() + seconds

    def spent(self) -> bool:
        return time.perf_counter() > self.end


def _relative(a, b):
    a, b = a.astype(jnp.float32).ravel(), b.astype(jnp.float32).ravel()
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def _values_and_grads(x, segment_ids, weights, implementation):
    """(o, final state) and the gradients of Σ o·w_o + Σ S_T·w_S w.r.t. every input."""
    def run(x):
        out, state = gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
            segment_ids=segment_ids, return_final_state=True, implementation=implementation)
        loss = jnp.sum(out.astype(jnp.float32) * weights[0]) + jnp.sum(state * weights[1])
        return loss, (out, state)

    (_, values), grads = jax.jit(jax.value_and_grad(run, has_aux=True))(x)
    return values, grads


def _forward(x, segment_ids):
    return gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
        segment_ids=segment_ids, return_final_state=True, implementation="pallas")


def part_check(args, budget):
    """The kernels on the GPU against the float32 per-token reference (values and gradients)."""
    rows = []
    for batch, length, heads, key_dim, value_dim, dtype, documents in CHECK_CASES:
        if budget.spent():
            rows.append({"T": length, "K": key_dim, "V": value_dim, "error": "skipped (budget)"})
            continue
        x = make_inputs(batch, length, heads, key_dim, value_dim, jax.random.key(1), dtype)
        x32 = {name: a.astype(jnp.float32) for name, a in x.items()}
        ids = packed_segments(batch, length, jax.random.key(2), median=200) if documents else None
        w_out = jax.random.normal(jax.random.key(3), x["v"].shape, jnp.float32)
        w_state = jax.random.normal(jax.random.key(4), x["initial_state"].shape, jnp.float32)

        weights = (w_out, w_state)
        (ref_out, ref_state), ref_grads = _values_and_grads(x32, ids, weights, "reference")
        (out, state), grads = _values_and_grads(x, ids, weights, "pallas")
        # The forward alone (no gradient pending) runs `default_block_sizes(training=False)`.
        primal_out, _ = jax.jit(functools.partial(_forward, segment_ids=ids))(x)
        errors = {"out": _relative(out, ref_out), "final_state": _relative(state, ref_state),
                  "out_primal": _relative(primal_out, ref_out)}
        errors.update({f"d{n}": _relative(grads[n], ref_grads[n]) for n in GRAD_NAMES})
        row = {"B": batch, "T": length, "H": heads, "K": key_dim, "V": value_dim,
               "dtype": jnp.dtype(dtype).name, "docs": documents, **errors,
               "pass": bool(max(errors.values()) < TOLERANCE)}
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["B", "T", "K", "V", "dtype", "docs", "out", "out_primal", "final_state",
                       *(f"d{n}" for n in GRAD_NAMES), "pass", "error"])
    print("check:", "PASS" if rows and all(r.get("pass") for r in rows) else "FAIL")
    return rows


def part_table(args, budget):
    rows = []
    for shape in args.shapes:
        batch, length = map(int, shape.split("x"))
        x = make_inputs(batch, length, HEADS, DIM, DIM, jax.random.key(0))
        inputs = [x[n] for n in GRAD_NAMES[:5]]
        flops = gdn_flops(batch, length)
        impls = [("cudnn_causal", cudnn_op(None), inputs[:3],
                  4 * DIM * batch * HEADS * length * (length + 1) / 2),
                 ("pallas", op("pallas"), inputs, flops)]
        if length == 8192:
            impls.append(("pallas_packed", op("pallas", packed_segments(
                batch, length, jax.random.key(5))), inputs, flops))
        impls.append(("xla", op("xla"), inputs, flops))
        baseline = None
        for name, fn, fn_inputs, fn_flops in impls:
            row = {"impl": name, "B": batch, "T": length}
            if budget.spent():
                row["error"] = "skipped (budget)"
            else:
                row.update(measure(fn, fn_inputs, fn_flops))
            if name == "cudnn_causal":
                baseline = row
            elif baseline and "fwd_ms" in row and "fwd_ms" in baseline:
                row["fwd_vs_cudnn"] = row["fwd_ms"] / baseline["fwd_ms"]
                if "fwd_bwd_ms" in row and "fwd_bwd_ms" in baseline:
                    row["fwd_bwd_vs_cudnn"] = row["fwd_bwd_ms"] / baseline["fwd_bwd_ms"]
            rows.append(row)
            print(row, flush=True)
    print_table(rows, ["impl", "B", "T", "fwd_ms", "fwd_bwd_ms", "fwd_vs_cudnn",
                       "fwd_bwd_vs_cudnn", "fwd_TFLOPs", "temp_MiB", "error"])
    return rows


def sweep_variants() -> dict[str, tuple[str, BlockSizes]]:
    """name → (what it is timed on, tiles): one knob changed from the defaults at a time."""
    base = default_block_sizes(DIM, DIM)
    forward = dict(value_block_32=dict(value_block=32),
                   value_block_128_warps_8=dict(value_block=128, state_num_warps=8),
                   state_warps_8=dict(state_num_warps=8), state_stages_1=dict(state_num_stages=1),
                   state_stages_3=dict(state_num_stages=3),
                   prepare_warps_8=dict(prepare_num_warps=8),
                   prepare_stages_2=dict(prepare_num_stages=2))
    backward = dict(chunk_32=dict(chunk=32),
                    gradient_warps_4=dict(gradient_num_warps=4),
                    gradient_tiles_32=dict(gradient_key_block=32, gradient_value_block=32),
                    gradient_stages_2=dict(gradient_num_stages=2))
    variants = {"default": ("both", base)}
    variants.update({n: ("fwd", dataclasses.replace(base, **c)) for n, c in forward.items()})
    variants.update({n: ("fwd_bwd", dataclasses.replace(base, **c)) for n, c in backward.items()})
    return variants


def _time_variant(blocks, inputs, timed_on):
    """fwd (and fwd+bwd unless `timed_on` is "fwd") ms of the kernels with these tiles."""
    fwd, fwd_bwd = forward_and_backward(kernel_op(blocks), len(inputs))
    row = {}
    try:
        row["fwd_ms"] = time_compiled(fwd.lower(*inputs).compile(), *inputs)
        if timed_on != "fwd":
            row["fwd_bwd_ms"] = time_compiled(fwd_bwd.lower(*inputs).compile(), *inputs)
    except Exception as e:  # noqa: BLE001  (report and go on with the next variant)
        row["error"] = error_text(e, 120)
    return row


def part_sweep(args, budget):
    batch, length = SWEEP_SHAPE
    x = make_inputs(batch, length, HEADS, DIM, DIM, jax.random.key(0))
    inputs = [x[n] for n in GRAD_NAMES[:5]]
    rows = []
    for name, (timed_on, blocks) in sweep_variants().items():
        row = {"variant": name, "timed_on": timed_on}
        row.update({"error": "skipped (budget)"} if budget.spent()
                   else _time_variant(blocks, inputs, timed_on))
        row["blocks"] = str(blocks)
        rows.append(row)
        print({k: v for k, v in row.items() if k != "blocks"}, flush=True)
    print_table(rows, ["variant", "timed_on", "fwd_ms", "fwd_bwd_ms", "error"])
    for column in ("fwd_ms", "fwd_bwd_ms"):
        timed = [r for r in rows if column in r]
        if timed:
            best = min(timed, key=lambda r: r[column])
            print(f"best {column}: {best['variant']} {best[column]:.3f} ms  {best['blocks']}")
    return rows


PARTS = {"check": part_check, "table": part_table, "sweep": part_sweep}


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    for part in PARTS:
        parser.add_argument(f"--{part}", action="store_true", help=f"run the {part} part")
    parser.add_argument("--shapes", type=lambda s: s.split(","),
                        default=["8x4096", "4x8192", "2x16384"], help="BATCHxLENGTH,...")
    parser.add_argument("--budget-s", type=float, default=190.0,
                        help="rows left after this many seconds are skipped")
    parser.add_argument("--fused-gradients", action="store_true",
                        help="check and time the kernels with the per-chunk gradients fused "
                             "in one kernel at 8 warps (round 2's form; the default splits "
                             "them, BlockSizes.split_gradients): the op's pallas rung then "
                             "runs its default tiles with this change")
    parser.add_argument("--variant", default="",
                        help="check and time the op's pallas rung with its default tiles "
                             "changed as linear_ops' GDN variant of this label (e.g. 'prepare "
                             "TF32 merges'): a variant's GPU accuracy before it is a default")
    parser.add_argument("--out", default="delta_rule_kernel.json")
    args = parser.parse_args()
    variants = dict(GDN_VARIANTS)
    if args.variant and args.variant not in variants:
        parser.error(f"--variant: unknown {args.variant!r}; expected one of {list(variants)}")
    changes = {**(dict(split_gradients=False, gradient_num_warps=8) if args.fused_gradients
                  else {}), **variants.get(args.variant, {})}
    print(device_name(), flush=True)
    budget = Budget(args.budget_s)
    chosen = [part for part in PARTS if getattr(args, part)] or list(PARTS)
    with changed_defaults(api, changes):
        results = {part: PARTS[part](args, budget) for part in chosen}
    write_json(args.out, "delta_rule_kernel", results.get("table", []),
               check=results.get("check"), sweep=results.get("sweep"))


if __name__ == "__main__":
    run_with_logging(main)
