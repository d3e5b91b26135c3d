"""Packed flash attention (Pallas, segment ids) against cuDNN without segments and XLA with them.

    python -m experiments.benchmarks.flash_attention [--parts check,sweep,table]
        [--shapes 125m,d128,d256] [--sweep-seconds 40] [--rounds 1] [--documents packed|causal]
        [--skip xla,swa] [--interpret] [--out flash_attention.json]

Documents are synthetic: lengths drawn log-normal (median --doc-median tokens, σ = 1, the
spread of web-text documents), packed back to back. Parts:
  check     bf16 kernel vs a float32 XLA reference with the same segment ids: values and
            gradients of q, k, v (relative error), causal and windowed, GQA, head dims; and
            `ops.attention`'s pallas and cudnn rungs with values 12 head dims wide, and the
            pallas rung with only random_chunks' attention-mode rows active
  sweep     per head dim (the shapes'), each kernel (forward, dq, dk/dv) timed alone under
            BlockSizes variants (tiles, warps, stages; dq by atomics; dk/dv per query head
            with GQA), each checked against the default's result; prints the fastest
            combination as the BlockSizes to put in block_sizes.py, with each kernel's ms
            against the default's. Per shape, stops starting variants after --sweep-seconds;
            with --rounds R, every variant compiled is timed R times, in turns with the
            others (the default's among them), and keeps the median (one-shot times of
            ≈ 0.5 ms kernels spread ≈ 10 %: BENCHMARKS.md, session 26). Each time is of
            `timing.CALLS` back-to-back calls, as the tables' are (single calls, with their
            dispatch and sync, spread 10–30 % over five rounds: session 29).
            On packed documents, or with --documents causal on one document per row (the
            causal triangle: long documents).
  table     fwd and fwd+bwd ms, TFLOP/s (useful pairs only) and temp memory: cuDNN causal and
            sliding window (no segments), the kernel unpacked / packed / packed + window (and
            unpacked / packed with the swept blocks when the sweep ran first), XLA packed,
            and (GPU only) JAX's own Mosaic GPU causal attention without segments (forward,
            float16, beside cuDNN in float16)

Useful FLOPs: 4·D per (query, visible key) per head, fwd+bwd = 3.5 × fwd.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import (
    CALLS,
    cudnn_op,
    device_name,
    error_text,
    measure,
    print_table,
    run_parts,
    time_compiled,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import ops
from hybrid_jax.ops.attention import attention_xla
from pallas_kernels.flash_attention import api, gpu
from pallas_kernels.flash_attention.block_sizes import default_block_sizes
from pallas_kernels.flash_attention.bounds import document_extents, visible_span

# name: (batch, length, heads, kv_heads, head_dim, window of the windowed rows)
SHAPES = {"125m": (16, 2048, 12, 12, 64, 512), "d128": (4, 8192, 16, 16, 128, 1024),
          "d128-gqa-32k": (1, 32768, 16, 4, 128, 1024), "d256": (4, 8192, 4, 4, 256, 1024),
          "tiny": (1, 256, 2, 1, 64, 64)}  # CPU smoke runs of this script (--interpret)
INTERPRET = {"on": False}  # --interpret: the kernels in Pallas interpret mode


def packed_segments(batch: int, length: int, median: float, seed: int = 0) -> np.ndarray:
    """`[B, T]` int32 ids of log-normal document lengths packed back to back."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        lengths = []
        while sum(lengths) < length:
            lengths.append(max(1, int(rng.lognormal(np.log(median), 1.0))))
        rows.append(np.repeat(np.arange(len(lengths)), lengths)[:length])
    return np.stack(rows).astype(np.int32)


def useful_pairs(segment_ids, batch, length, window) -> int:
    """(query, visible key) pairs of a batch; documents are contiguous here."""
    ids = jnp.zeros((batch, length), jnp.int32) if segment_ids is None else jnp.asarray(
        segment_ids)
    lowest = visible_span(document_extents(ids), window)[0]
    return int(jnp.sum(jnp.arange(length) - lowest + 1))


def _useful_flops(width, batch, length, segment_ids, window) -> int:
    return 4 * width * useful_pairs(segment_ids, batch, length, window)


def inputs(batch, length, heads, kv_heads, dim, dtype=jnp.bfloat16, seed=0, value_dim=None):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (batch, length, heads, dim), jnp.float32)
    k, v = (jax.random.normal(key, (batch, length, kv_heads, width), jnp.float32)
            for key, width in zip(keys[1:], (dim, value_dim or dim), strict=True))
    return [x.astype(dtype) for x in (q, k, v)]


def kernel_op(segments, window, blocks=None):
    return lambda q, k, v: api.flash_attention(q, k, v, segments, window=window,
                                               block_sizes=blocks, interpret=INTERPRET["on"])


def as_float16(op):
    """`op` on float16 copies of q, k, v (the casts are timed too)."""
    return lambda *x: op(*(a.astype(jnp.float16) for a in x))


def mosaic_op(block_kv: int):
    """JAX's own Mosaic GPU attention (`attention_mgpu`: Hopper warp-group MMAs, warp-specialised
    TMA loads), causal, no segments, in float16 (its bf16 path fails to lower in jax 0.11.2):
    a peer row for the lowering question (issue 15, item 3), beside cuDNN in float16. Its causal
    backward is not implemented in JAX, so its rows have a forward time only."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    config = attention_mgpu.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2,
                                         causal=True)
    return as_float16(lambda q, k, v: attention_mgpu.attention(q, k, v, config))


def xla_op(segments, window):
    return lambda q, k, v: attention_xla(q, k, v, causal=True, window=window,
                                         scale=q.shape[-1] ** -0.5, segment_ids=segments,
                                         q_positions=None, kv_positions=None, kv_segment_ids=None)


def _value_and_grads(op, x, weights):
    loss = lambda *x: jnp.sum(op(*x).astype(jnp.float32) * weights)
    return jax.jit(op)(*x), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*x)


def op_rung(implementation, segments, window, active=None):
    """`ops.attention` on one named rung (the kernels behind the op's wrapping: wide values)."""
    return lambda q, k, v: ops.attention(q, k, v, window=window, segment_ids=segments,
                                         active_queries=active, implementation=implementation)


def random_chunks(batch: int, length: int, chunk: int = 128, seed: int = 0) -> jax.Array:
    """Oryx's random_chunks training modes as active query rows: chunks of `chunk` tokens,
    each active with probability 1/2."""
    drawn = np.random.default_rng(seed).random((batch, -(-length // chunk))) < 0.5
    return jnp.asarray(np.repeat(drawn, chunk, axis=1)[:, :length])


# (T, H, G, D, Dv, window, rung): the kernel through its API, then through the op with values
# 12 head dims wide (Oryx-mamba2-130m's attention mode, `value_heads`), packed and not, and
# with only random_chunks' attention-mode rows active ("pallas-active").
CHECKS = ((2048, 8, 2, 64, 64, None, "kernel"), (2048, 8, 8, 128, 128, 256, "kernel"),
          (1999, 4, 2, 256, 256, None, "kernel"), (2048, 4, 4, 128, 128, 100, "kernel"),
          (1999, 1, 1, 128, 1536, None, "pallas"), (2048, 2, 1, 128, 1536, 300, "cudnn"),
          (1999, 1, 1, 128, 1536, None, "pallas-active"), (2048, 4, 2, 64, 64, 300,
                                                           "pallas-active"))


def part_check(args):
    rows = []
    for length, heads, kv_heads, dim, value_dim, window, rung in CHECKS:
        x = inputs(2, length, heads, kv_heads, dim, seed=1, value_dim=value_dim)
        x32 = [a.astype(jnp.float32) for a in x]
        segments = (None if rung == "cudnn" else
                    jnp.asarray(packed_segments(2, length, args.doc_median, seed=1)))
        weights = jax.random.normal(jax.random.key(2), (*x[0].shape[:3], value_dim),
                                    jnp.float32)
        if rung == "kernel":
            reference = functools.partial(api.flash_attention, segment_ids=segments,
                                          window=window, implementation="reference")
            op = kernel_op(segments, window)
        else:
            active = random_chunks(2, length) if rung == "pallas-active" else None
            implementation = rung.removesuffix("-active")
            reference = op_rung("reference", segments, window, active)
            op = op_rung(implementation, segments, window, active)
        ref_out, ref_grads = _value_and_grads(reference, x32, weights)
        out, grads = _value_and_grads(op, x, weights)
        rel = lambda a, b: float(jnp.linalg.norm((a.astype(jnp.float32) - b).ravel())
                                 / jnp.linalg.norm(b.ravel()))
        row = {"rung": rung, "T": length, "H": heads, "G": kv_heads, "D": dim, "Dv": value_dim,
               "w": window, "out": rel(out, ref_out),
               **{f"d{n}": rel(g, r) for n, g, r in zip("qkv", grads, ref_grads, strict=True)}}
        row["ok"] = max(row[c] for c in ("out", "dq", "dk", "dv")) < 1e-2
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["rung", "T", "H", "G", "D", "Dv", "w", "out", "dq", "dk", "dv", "ok"])
    return rows


def part_table(args):
    rows = []
    for name in args.shapes:
        batch, length, heads, kv_heads, dim, window = SHAPES[name]
        x = inputs(batch, length, heads, kv_heads, dim)
        segments = jnp.asarray(packed_segments(batch, length, args.doc_median))
        pairs_flops = functools.partial(_useful_flops, dim * heads, batch, length)
        cases = [("cudnn causal", cudnn_op(None), None, None),
                 ("cudnn swa", cudnn_op(window), None, window),
                 ("pallas causal", kernel_op(None, None), None, None),
                 ("pallas packed", kernel_op(segments, None), segments, None),
                 ("pallas packed swa", kernel_op(segments, window), segments, window),
                 ("xla packed", xla_op(segments, None), segments, None),
                 ("cudnn causal f16", as_float16(cudnn_op(None)), None, None),
                 ("jax mosaic causal kv128", mosaic_op(128), None, None),
                 ("jax mosaic causal kv64", mosaic_op(64), None, None)]
        swept = getattr(args, "swept", {}).get(dim)
        if swept is not None and swept != default_block_sizes(dim):  # the sweep ran before
            cases[4:4] = [("pallas causal swept", kernel_op(None, None, swept), None, None),
                          ("pallas packed swept", kernel_op(segments, None, swept), segments,
                           None)]
        for impl, op, seg, w in cases:
            if any(word in impl for word in args.skip):
                continue
            if impl.startswith("cudnn") and dim > 128:
                continue
            if "mosaic" in impl and (INTERPRET["on"] or jax.default_backend() != "gpu"):
                continue
            if impl == "xla packed" and length > 8192:
                continue
            row = {"shape": name, "impl": impl, "B": batch, "T": length, "H": heads,
                   "G": kv_heads, "D": dim, "w": w,
                   **measure(op, x, pairs_flops(seg, w))}
            rows.append(row)
            print(row, flush=True)
    print_table(rows, ["shape", "impl", "w", "fwd_ms", "fwd_TFLOPs", "fwd_bwd_ms",
                       "fwd_bwd_TFLOPs", "temp_MiB", "error"])
    return rows


# Per head dim and kernel: the BlockSizes fields a variant sets, (tiles, warps, stages[, ...]),
# likelier first (a time-limited sweep keeps them); the default's blocks always run first.
# The flags after the four counts are False unless given; diagonal_causal_only is one field
# for the three kernels, swept in each (the assembled BlockSizes takes the dk/dv kernel's).
SWEEP = {
    "forward": ("block_q", "block_k", "num_warps", "num_stages", "forward_one_select",
                "diagonal_causal_only"),
    "dq": ("block_q_dq", "block_k_dq", "dq_num_warps", "dq_num_stages", "diagonal_causal_only"),
    "dkv": ("block_q_dkv", "block_k_dkv", "dkv_num_warps", "dkv_num_stages", "dq_atomic",
            "dkv_per_query_head", "diagonal_causal_only"),
}
SWEEP_VARIANTS = {
    # D 64 (session 18, ptxas only): the one-select forward and the causal-only diagonal at
    # today's tiles and at 128 query rows on 8 warps (115-122 registers: two programs a SM).
    # First: session 26's one-shot leads (BENCHMARKS.md), for --rounds.
    64: {"forward": [(64, 64, 4, 3, True, True), (64, 32, 4, 4, True),
                     (64, 32, 4, 4, True, True), (64, 32, 4, 4, False, True),
                     (128, 32, 8, 3, True, True), (128, 32, 8, 3), (128, 64, 8, 3, True, True),
                     (128, 32, 8, 4, True, True),
                     (64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
                     (128, 32, 4, 4), (64, 64, 4, 4), (128, 64, 4, 4)],
         "dq": [(64, 64, 4, 2), (64, 64, 4, 3, True), (128, 32, 8, 3, True), (64, 32, 4, 3, True),
                (128, 32, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3),
                (128, 32, 8, 3), (128, 128, 8, 2)],
         "dkv": [(32, 64, 4, 3, False, False, True), (32, 128, 4, 3, False, False, True),
                 (64, 64, 4, 2), (32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3),
                 (16, 128, 4, 3), (64, 64, 4, 2, True), (32, 128, 4, 3, True),
                 (64, 128, 8, 2, True)]},
    128: {"forward": [(128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3),
                      (128, 128, 8, 2), (128, 64, 4, 3), (128, 64, 8, 4)],
          "dq": [(128, 64, 8, 2), (128, 32, 4, 4), (64, 64, 4, 2), (128, 32, 8, 3),
                 (64, 32, 4, 3), (128, 64, 8, 3)],
          "dkv": [(32, 64, 4, 3), (32, 128, 8, 2), (64, 64, 4, 2), (32, 64, 8, 2), (16, 64, 4, 2),
                  (64, 128, 8, 2), (16, 128, 8, 3), (32, 128, 8, 2, True),
                  (32, 128, 8, 2, False, True)]},
    # D 256 (session 21, for nha-hybrid-340m's full-attention layers on WikiText-2's longer
    # documents): the session-18 options and stage counts around run C's picks first.
    256: {"forward": [(64, 16, 4, 3, True), (64, 16, 4, 3, True, True), (64, 16, 4, 4),
                      (64, 32, 4, 3), (128, 16, 8, 3), (64, 32, 8, 2), (64, 64, 8, 2),
                      (32, 32, 4, 2), (64, 32, 4, 2), (128, 32, 8, 2), (64, 16, 4, 3)],
          "dq": [(128, 32, 8, 2, True), (128, 16, 8, 2), (128, 32, 8, 3), (64, 32, 4, 2),
                 (64, 32, 8, 2), (32, 32, 4, 2), (64, 16, 4, 2), (128, 32, 8, 2), (64, 32, 4, 1)],
          "dkv": [(32, 32, 4, 2, False, False, True), (32, 32, 4, 3), (64, 32, 8, 2),
                  (32, 16, 4, 2), (16, 16, 4, 2), (32, 32, 8, 2), (16, 32, 4, 2), (32, 64, 8, 2),
                  (16, 64, 8, 2), (32, 32, 4, 2), (32, 32, 8, 2, True)]},
}


def _sweep_kernels(q, k, v, segments, window):
    """Per kernel: a function of (BlockSizes, *arrays) and its arrays (the inputs of the
    backward from one forward pass). The "dkv" function with dq_atomic is the whole backward,
    (dq, dk, dv)."""
    spans = visible_span(document_extents(segments), window)
    static = lambda blocks: gpu.Static(window=window, scale=q.shape[-1] ** -0.5,
                                       group=q.shape[2] // k.shape[2], blocks=blocks,
                                       interpret=INTERPRET["on"])
    forward = lambda b, q, k, v, seg, *spans: gpu.forward(q, k, v, seg, None, spans, static(b))
    o, lse = jax.jit(functools.partial(forward, default_block_sizes(q.shape[-1])))(
        q, k, v, segments, *spans)
    do = jax.random.normal(jax.random.key(3), q.shape, jnp.float32).astype(q.dtype)
    delta = jnp.einsum("bthd,bthd->bht", o.astype(jnp.float32), do.astype(jnp.float32))

    def dkv(b, q, k, v, o, do, lse, delta, seg, *spans):
        if b.dq_atomic:
            return gpu.backward(q, k, v, o, lse, do, seg, None, spans, static(b))
        return gpu._dkv(q, k, v, do, lse, delta, seg, None, spans, static(b))

    dq = lambda b, q, k, v, do, lse, delta, seg, *spans: gpu._dq(q, k, v, do, lse, delta, seg,
                                                                spans, static(b))
    return {"forward": (forward, (q, k, v, segments, *spans)),
            "dq": (dq, (q, k, v, do, lse, delta, segments, *spans)),
            "dkv": (dkv, (q, k, v, o, do, lse, delta, segments, *spans))}


def _max_rel(got, want) -> float:
    return max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))
                     / (float(jnp.max(jnp.abs(w.astype(jnp.float32)))) + 1e-30))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))


def _variant(base, kernel: str, values):
    """`base` with a SWEEP_VARIANTS entry's fields (the flags False unless given); `values`
    None: `base`."""
    if values is None:
        return base
    fields = SWEEP[kernel]
    values = tuple(values) + (False,) * (len(fields) - len(values))
    return dataclasses.replace(base, **dict(zip(fields, values, strict=True)))


def part_sweep(args):
    """Each kernel under its variants (the other kernels at their defaults), per head dim,
    on the table's shapes (packed documents, or one per row), each result checked against the
    split default's. Picks the fastest forward, dq and dk/dv (an atomic-dq backward competes with
    dq + dk/dv) and prints them as the BlockSizes to paste into block_sizes.py, with the ms
    of the default's kernels; the table part (after it) times fwd+bwd of both."""
    rows, best = [], {}
    for name in args.shapes:
        deadline = time.perf_counter() + args.sweep_seconds
        batch, length, heads, kv_heads, dim, _ = SHAPES[name]
        x = inputs(batch, length, heads, kv_heads, dim)
        segments = (jnp.zeros((batch, length), jnp.int32) if args.documents == "causal" else
                    jnp.asarray(packed_segments(batch, length, args.doc_median)))
        kernels = _sweep_kernels(*x, segments, None)
        base = dataclasses.replace(default_block_sizes(dim), dq_atomic=False,
                                   dkv_per_query_head=False)
        run = lambda kernel, blocks, kernels=kernels: jax.jit(
            functools.partial(kernels[kernel][0], blocks))
        expected = {kernel: run(kernel, base)(*kernels[kernel][1]) for kernel in SWEEP}
        times, seen, compiled = {}, set(), []
        # Round robin over the kernels, so that the time limit cuts each kernel's list alike.
        lists = [[(kernel, None)] + [(kernel, v) for v in SWEEP_VARIANTS[dim][kernel]]
                 for kernel in SWEEP]
        order = [pair for group in itertools.zip_longest(*lists) for pair in group if pair]
        for kernel, values in order:
            blocks = _variant(base, kernel, values)
            if (kernel, blocks) in seen or (blocks.dkv_per_query_head and heads == kv_heads):
                continue  # a repeat, or per query head without GQA
            seen.add((kernel, blocks))
            row = {"shape": name, "D": dim, "documents": args.documents, "kernel": kernel,
                   "blocks": str({f: getattr(blocks, f) for f in SWEEP[kernel]})}
            rows.append(row)
            if time.perf_counter() > deadline:
                row["error"] = "skipped: --sweep-seconds reached"
                continue
            try:
                fn = run(kernel, blocks).lower(*kernels[kernel][1]).compile()
                want = expected[kernel]
                if kernel == "dkv" and blocks.dq_atomic:
                    want = (expected["dq"], *expected["dkv"])
                row["max_rel_diff"] = _max_rel(fn(*kernels[kernel][1]), want)
                row["ms_rounds"] = [time_compiled(fn, *kernels[kernel][1], calls=CALLS)]
                if row["max_rel_diff"] < 2e-2:
                    compiled.append((row, fn, kernels[kernel][1], (kernel, blocks)))
                else:
                    row["error"] = "differs from the default blocks"
            except Exception as e:  # noqa: BLE001  (a variant that fails to compile)
                row["error"] = error_text(e, 100)
            print(row, flush=True)
        for _ in range(args.rounds - 1):  # the later rounds, in turns
            for row, fn, arrays, _ in compiled:
                row["ms_rounds"].append(time_compiled(fn, *arrays, calls=CALLS))
        for row, _, _, key in compiled:
            row["ms"] = times[key] = statistics.median(row["ms_rounds"])
        best[name] = _assemble(base, times)
    print_table(rows, ["shape", "kernel", "blocks", "ms", "max_rel_diff", "error"])
    for name, (blocks, parts) in best.items():
        print(f"{name} (D {SHAPES[name][4]}, {args.documents}): BlockSizes(**{blocks.changed()})"
              f"  # ms {parts}")
    args.swept = {SHAPES[name][4]: blocks for name, (blocks, _) in best.items()}
    return {"variants": rows, "best": {name: {"blocks": b.changed(), "ms": parts}
                                       for name, (b, parts) in best.items()}}


def _assemble(base, times):
    """The fastest forward, dq and dk/dv fields, and their ms (`times[(kernel, blocks)]`)."""
    fastest = lambda kernel, pick=lambda b: True: min(
        ((ms, b) for (k, b), ms in times.items() if k == kernel and pick(b)),
        key=lambda t: t[0], default=(None, base))
    fwd_ms, fwd = fastest("forward")
    dq_ms, dq = fastest("dq")
    split_ms, split = fastest("dkv", lambda b: not b.dq_atomic)
    atomic_ms, atomic = fastest("dkv", lambda b: b.dq_atomic)
    use_atomic = atomic_ms is not None and (split_ms is None or dq_ms is None
                                            or atomic_ms < split_ms + dq_ms)
    dkv = atomic if use_atomic else split
    default = {kernel: times.get((kernel, base)) for kernel in SWEEP}
    fields = {f: getattr(fwd, f) for f in SWEEP["forward"]}
    fields.update({f: getattr(dq, f) for f in SWEEP["dq"]})
    fields.update({f: getattr(dkv, f) for f in SWEEP["dkv"]})
    parts = {"forward": fwd_ms, "dq": None if use_atomic else dq_ms,
             "dkv": atomic_ms if use_atomic else split_ms, "default": default}
    return dataclasses.replace(base, **fields), parts


def main():
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--parts", default="check,table")
    parser.add_argument("--shapes", default="125m,d128,d256")
    parser.add_argument("--doc-median", type=float, default=1024)
    parser.add_argument("--sweep-seconds", type=float, default=40,
                        help="per shape: the sweep skips the variants left after this long")
    parser.add_argument("--rounds", type=int, default=1,
                        help="the sweep times each variant this many times, in turns with the "
                             "others, and keeps the median")
    parser.add_argument("--documents", choices=("packed", "causal"), default="packed",
                        help="the sweep's rows: packed documents or one document per row")
    parser.add_argument("--out", default="flash_attention.json")
    parser.add_argument("--skip", default="", help="table rows to leave out: comma-separated "
                        "words of their names, e.g. xla,swa")
    parser.add_argument("--interpret", action="store_true",
                        help="kernels in interpret mode: a CPU smoke run (--shapes tiny)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    INTERPRET["on"] = args.interpret
    args.skip = [word for word in args.skip.split(",") if word]
    args.shapes = args.shapes.split(",")
    print(device_name(), flush=True)
    parts = {"check": part_check, "sweep": part_sweep, "table": part_table}
    run_parts(parts, args.parts, args, args.out, "flash_attention", doc_median=args.doc_median)


if __name__ == "__main__":
    run_with_logging(main)
