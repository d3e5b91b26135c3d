"""Chunked linear-recurrence ops (XLA rungs) against cuDNN causal attention, fwd and fwd+bwd.

    python -m experiments.benchmarks.linear_ops [--shapes 8x4096,4x8192] [--out results.json]

Heads 16, K = V = P = N = 128 (GSA: 64 slots), bf16 inputs. Every op is timed in the same
process next to `jax.nn.dot_product_attention(implementation="cudnn", is_causal=True)` on the
same [B, T, H, 128] shapes; the ratio column is op time / cuDNN time (fwd+bwd).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import (
    device_name,
    forward_and_backward,
    print_table,
    temp_bytes,
    time_compiled,
    write_json,
)
from hybrid_jax import ops
from hybrid_jax.ops.delta_rule import gated_delta_rule
from hybrid_jax.ops.gsa import gated_slot_attention
from hybrid_jax.ops.ssd import ssd

HEADS, DIM, SLOTS = 16, 128, 64


def make_inputs(name: str, batch: int, length: int, key: jax.Array) -> tuple:
    keys = iter(jax.random.split(key, 8))
    bf16 = jnp.bfloat16

    def normal(*shape, dtype=bf16):
        return jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)

    bthk = (batch, length, HEADS, DIM)
    if name in ("cudnn_causal", "xla_attention"):
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


OPS = {
    "cudnn_causal": lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn"),
    "xla_attention": lambda q, k, v: ops.attention(q, k, v, implementation="xla"),
    "ssd": lambda *a: ssd(*a, chunk_size=64),
    "gated_delta_rule": lambda *a: gated_delta_rule(*a, chunk_size=64),
    "gated_slot_attention": lambda *a: gated_slot_attention(*a),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x4096,4x8192,2x16384",
                        help="comma-separated BATCHxLENGTH")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--out", default="linear_ops.json")
    args = parser.parse_args()
    print(device_name())
    rows = []
    for shape in args.shapes.split(","):
        batch, length = map(int, shape.split("x"))
        baseline = None
        for name in args.ops.split(","):
            inputs = make_inputs(name, batch, length, jax.random.key(0))
            fwd, fwd_bwd = forward_and_backward(OPS[name], len(inputs))
            row = {"op": name, "B": batch, "T": length}
            try:
                row["fwd_ms"] = time_compiled(fwd, *inputs)
                row["fwd_bwd_ms"] = time_compiled(fwd_bwd, *inputs)
                row["temp_MiB"] = (temp_bytes(fwd_bwd, *inputs) or 0) / 2**20
            except Exception as e:  # an op that cannot run this shape (e.g. out of memory)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            if name == "cudnn_causal":
                baseline = row.get("fwd_bwd_ms")
            if baseline and "fwd_bwd_ms" in row:
                row["vs_cudnn"] = row["fwd_bwd_ms"] / baseline
            rows.append(row)
            print(row, flush=True)
    print_table(rows, ["op", "B", "T", "fwd_ms", "fwd_bwd_ms", "vs_cudnn", "temp_MiB", "error"])
    write_json(args.out, "linear_ops", rows, heads=HEADS, dim=DIM, slots=SLOTS, dtype="bfloat16")


if __name__ == "__main__":
    main()
