"""Packed flash attention (Pallas, segment ids) against cuDNN without segments and XLA with them.

    python -m experiments.benchmarks.flash_attention [--parts check,table,variants]
        [--shapes 125m,d128,d256] [--out flash_attention.json]

Documents are synthetic: lengths drawn log-normal (median --doc-median tokens, σ = 1, the
spread of web-text documents), packed back to back. Parts:
  check     bf16 kernel vs a float32 XLA reference with the same segment ids: values and
            gradients of q, k, v (relative error), causal and windowed, GQA, head dims
  table     fwd and fwd+bwd ms, TFLOP/s (useful pairs only) and temp memory: cuDNN causal and
            sliding window (no segments), the kernel unpacked / packed / packed + window, XLA
            packed
  variants  the kernel under other tiles at the 125m and d128 shapes (tuning)

Useful FLOPs: 4·D per (query, visible key) per head, fwd+bwd = 3.5 × fwd.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import cudnn_op, device_name, measure, print_table, write_json
from hybrid_jax.ops.attention import attention_xla
from pallas_kernels.flash_attention import api
from pallas_kernels.flash_attention.block_sizes import default_block_sizes
from pallas_kernels.flash_attention.bounds import visible_span

# name: (batch, length, heads, kv_heads, head_dim, window of the windowed rows)
SHAPES = {"125m": (16, 2048, 12, 12, 64, 512), "d128": (4, 8192, 16, 16, 128, 1024),
          "d128-gqa-32k": (1, 32768, 16, 4, 128, 1024), "d256": (4, 8192, 4, 4, 256, 1024)}


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
    lowest = visible_span(ids, window)[0]
    return int(jnp.sum(jnp.arange(length) - lowest + 1))


def _useful_flops(width, batch, length, segment_ids, window) -> int:
    return 4 * width * useful_pairs(segment_ids, batch, length, window)


def inputs(batch, length, heads, kv_heads, dim, dtype=jnp.bfloat16, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (batch, length, heads, dim), jnp.float32)
    k, v = (jax.random.normal(key, (batch, length, kv_heads, dim), jnp.float32)
            for key in keys[1:])
    return [x.astype(dtype) for x in (q, k, v)]


def kernel_op(segments, window, blocks=None):
    return lambda q, k, v: api.flash_attention(q, k, v, segments, window=window,
                                               block_sizes=blocks)


def xla_op(segments, window):
    return lambda q, k, v: attention_xla(q, k, v, causal=True, window=window,
                                         scale=q.shape[-1] ** -0.5, segment_ids=segments,
                                         q_positions=None, kv_positions=None, kv_segment_ids=None)


def _value_and_grads(op, x, weights):
    loss = lambda *x: jnp.sum(op(*x).astype(jnp.float32) * weights)
    return jax.jit(op)(*x), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*x)


def part_check(args):
    rows = []
    for length, heads, kv_heads, dim, window in ((2048, 8, 2, 64, None), (2048, 8, 8, 128, 256),
                                                 (1999, 4, 2, 256, None), (2048, 4, 4, 128, 100)):
        x = inputs(2, length, heads, kv_heads, dim, seed=1)
        x32 = [a.astype(jnp.float32) for a in x]
        segments = jnp.asarray(packed_segments(2, length, args.doc_median, seed=1))
        weights = jax.random.normal(jax.random.key(2), x[0].shape, jnp.float32)

        reference = functools.partial(api.flash_attention, segment_ids=segments, window=window,
                                      implementation="reference")
        ref_out, ref_grads = _value_and_grads(reference, x32, weights)
        out, grads = _value_and_grads(kernel_op(segments, window), x, weights)
        rel = lambda a, b: float(jnp.linalg.norm((a.astype(jnp.float32) - b).ravel())
                                 / jnp.linalg.norm(b.ravel()))
        row = {"T": length, "H": heads, "G": kv_heads, "D": dim, "w": window,
               "out": rel(out, ref_out),
               **{f"d{n}": rel(g, r) for n, g, r in zip("qkv", grads, ref_grads, strict=True)}}
        row["ok"] = max(row[c] for c in ("out", "dq", "dk", "dv")) < 1e-2
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["T", "H", "G", "D", "w", "out", "dq", "dk", "dv", "ok"])
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
                 ("xla packed", xla_op(segments, None), segments, None)]
        for impl, op, seg, w in cases:
            if impl.startswith("cudnn") and dim > 128:
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


VARIANTS = {
    "q64k64": dict(block_q=64, block_k=64),
    "q128k128": dict(block_q=128, block_k=128),
    "w4": dict(num_warps=4),
    "w8": dict(num_warps=8),
    "bwd128": dict(block_q_dkv=128, block_k_dkv=128, block_q=128, block_k=128),
    "bwd_q32k128": dict(block_q_dkv=32, block_k_dkv=128),
    "stages2": dict(num_stages=2, backward_num_stages=1),
}


def part_variants(args):
    rows = []
    for name in ("125m", "d128"):
        batch, length, heads, kv_heads, dim, _ = SHAPES[name]
        x = inputs(batch, length, heads, kv_heads, dim)
        segments = jnp.asarray(packed_segments(batch, length, args.doc_median))
        flops = 4 * dim * heads * useful_pairs(segments, batch, length, None)
        base = default_block_sizes(dim)
        for variant in ["default", *VARIANTS]:
            blocks = (base if variant == "default"
                      else dataclasses.replace(base, **VARIANTS[variant]))
            row = {"shape": name, "variant": variant,
                   **measure(kernel_op(segments, None, blocks), x, flops, memory=False)}
            rows.append(row)
            print(row, flush=True)
    print_table(rows, ["shape", "variant", "fwd_ms", "fwd_TFLOPs", "fwd_bwd_ms",
                       "fwd_bwd_TFLOPs", "error"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="check,table")
    parser.add_argument("--shapes", default="125m,d128,d256")
    parser.add_argument("--doc-median", type=float, default=1024)
    parser.add_argument("--out", default="flash_attention.json")
    args = parser.parse_args()
    args.shapes = args.shapes.split(",")
    print(device_name(), flush=True)
    parts = {"check": part_check, "table": part_table, "variants": part_variants}
    results = {}
    for part in args.parts.split(","):
        try:
            results[part] = parts[part](args)
        except Exception as e:  # noqa: BLE001  (one failed part must not cost the others)
            print(f"part {part} failed: {type(e).__name__}: {e}", flush=True)
            results[part] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
    write_json(args.out, "flash_attention", [], doc_median=args.doc_median, **results)


if __name__ == "__main__":
    main()
