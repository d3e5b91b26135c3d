"""The Pallas rungs under a mesh of the GPUs present (`hybrid_jax.ops.partition`).

For each rung (flash attention, gated delta rule, SSD, GSA, NHA) at a training shape (bf16,
packed documents), the forward and backward of Σ w·outputs, compiled and timed:

* `1 device`: the op on one GPU, the whole batch (the reference);
* `manual 1`: the same inside a `jax.shard_map` over a one-device mesh (the kernels' out shapes
  typed for shard_map on the real Triton lowering: what context parallelism and every mesh
  need; the only mesh row one GPU can run);
* with n ≥ 2 GPUs, `data=n` and `data=n/2 × tensor=2`: each GPU runs its batch rows and heads.

Each row has the time, the relative error of outputs and gradients against `1 device` (the
same math per shard: ~0 for `manual 1`, bf16 rounding of other tiles at most), and the
all-gathers in the compiled program (0 for the kernels' inputs: each device runs its shard).

    python -m experiments.benchmarks.sharded_kernels [--batch-per-device 2] [--length 4096]

On one GPU two programs per rung are compiled and timed (meant to fit 3 minutes; `python -u`
prints each rung's rows as it ends). `--shrink 8` divides the head counts and widths, as the
CPU test does with the kernels interpreted (`tests/ops/test_partition.py`).

Writes experiments/benchmarks/results/sharded_kernels_<n>gpu.json.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.benchmarks.timing import error_text, print_table, time_compiled, write_json
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.sharding import logical_to_spec, make_mesh

LOGICAL = {"B": "batch", "H": "heads", "G": "kv_heads"}
Case = tuple[Callable[[dict, jax.Array], Any], dict[str, jax.Array], dict[str, str]]
# Every case: (key, batch, length, d) with d(n) the head count or width n at the bench's scale
# (n itself; `--shrink k` divides it by k for a smoke run on CPU).


def _normal(key, shape, dtype=jnp.bfloat16, scale=1.0):
    return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def attention_case(key, B, T, d) -> Case:
    k1, k2, k3 = jax.random.split(key, 3)
    x = dict(q=_normal(k1, (B, T, d(16), d(128))), k=_normal(k2, (B, T, d(4), d(128))),
             v=_normal(k3, (B, T, d(4), d(128))))
    run = lambda x, ids: ops.attention(x["q"], x["k"], x["v"], segment_ids=ids,
                                       implementation="pallas")
    return run, x, dict(q="BTHD", k="BTGD", v="BTGD")


def delta_rule_case(key, B, T, d) -> Case:
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    k = _normal(k2, (B, T, d(16), d(128)), jnp.float32)
    x = dict(q=_normal(k1, (B, T, d(16), d(128))),
             k=(k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16),
             v=_normal(k3, (B, T, d(16), d(128))),
             g=-jnp.exp(_normal(k4, (B, T, d(16)), jnp.float32) - 3.0),
             beta=jax.nn.sigmoid(_normal(k5, (B, T, d(16)), jnp.float32)))
    run = lambda x, ids: ops.gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                              segment_ids=ids, return_final_state=True,
                                              implementation="pallas")
    return run, x, dict(q="BTHK", k="BTHK", v="BTHV", g="BTH", beta="BTH")


def ssd_case(key, B, T, d) -> Case:
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    x = dict(x=_normal(k1, (B, T, d(32), d(64))),
             dt=jax.nn.softplus(_normal(k2, (B, T, d(32)), jnp.float32) - 2.0),
             A=-jnp.exp(_normal(k3, (d(32),), jnp.float32, 0.5)),
             B=_normal(k4, (B, T, d(2), d(128)), scale=d(128) ** -0.5),
             C=_normal(k5, (B, T, d(2), d(128)), scale=d(128) ** -0.5))
    run = lambda x, ids: ops.ssd(x["x"], x["dt"], x["A"], x["B"], x["C"], segment_ids=ids,
                                 return_final_state=True, implementation="pallas")
    return run, x, dict(x="BTHP", dt="BTH", A="H", B="BTGN", C="BTGN")


def _slot_inputs(key, B, T, heads, kv_heads, dim):
    """q [B, T, heads, dim], k, v and the slot gates s, g [B, T, kv_heads, dim] (dim slots)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    g = jax.nn.log_sigmoid(_normal(k4, (B, T, kv_heads, dim), jnp.float32)) / 8.0
    return dict(q=_normal(k1, (B, T, heads, dim)), k=_normal(k2, (B, T, kv_heads, dim)),
                v=_normal(k3, (B, T, kv_heads, dim)), s=1 - jnp.exp(g), g=g)


def gsa_case(key, B, T, d) -> Case:
    x = _slot_inputs(key, B, T, d(16), d(16), d(64))
    run = lambda x, ids: ops.gated_slot_attention(
        x["q"], x["k"], x["v"], x["s"], x["g"], segment_ids=ids, return_final_state=True,
        implementation="pallas")
    return run, x, dict(q="BTHK", k="BTHK", v="BTHV", s="BTHM", g="BTHM")


def nha_case(key, B, T, d) -> Case:
    x = _slot_inputs(key, B, T, d(16), d(4), d(64))
    run = lambda x, ids: ops.native_hybrid_attention(
        x["q"], x["k"], x["v"], x["s"], x["g"], window=d(512), segment_ids=ids,
        implementation="pallas")
    return run, x, dict(q="BTHK", k="BTGK", v="BTGV", s="BTGM", g="BTGM")


CASES = dict(attention=attention_case, gated_delta_rule=delta_rule_case, ssd=ssd_case,
             gated_slot_attention=gsa_case, native_hybrid_attention=nha_case)


def _loss_and_grads(run, x, ids):
    """Σ w·(every output) in float32 (shape [1], so that a shard_map can return it), and its
    gradient with respect to every float input."""
    shapes = jax.tree.leaves(jax.eval_shape(run, x, ids))
    keys = jax.random.split(jax.random.key(1), len(shapes))
    weights = [jax.random.normal(key, s.shape, jnp.float32)
               for key, s in zip(keys, shapes, strict=True)]

    def loss(x):
        outs = jax.tree.leaves(run(x, ids))
        return sum(jnp.sum(w * y.astype(jnp.float32)) for w, y in zip(weights, outs, strict=True))

    value_and_grad = jax.value_and_grad(loss)
    return jax.jit(lambda x: (lambda value, grads: (value[None], grads))(*value_and_grad(x)))


def _segment_ids(B, T):
    """Documents of ~1000 tokens, starts on and off the kernels' tiles."""
    starts = jax.random.uniform(jax.random.key(2), (B, T)) < 1e-3
    return jnp.cumsum(starts, axis=1, dtype=jnp.int32)


def _placed(x, layouts, mesh):
    place = lambda a, layout: jax.device_put(a, NamedSharding(mesh, logical_to_spec(
        [LOGICAL.get(c) for c in layout], a.shape, mesh)))
    return {name: place(a, layouts[name]) for name, a in x.items()}


def _rel_err(got, expected) -> float:
    leaves = zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
    return max(float(jnp.linalg.norm((a - b).astype(jnp.float32))
                     / max(float(jnp.linalg.norm(b.astype(jnp.float32))), 1e-30))
               for a, b in leaves)


def _row(name, mesh_name, compiled, args, expected, iters) -> dict[str, Any]:
    got = compiled(*args)  # also the first warm-up call
    ms = time_compiled(compiled, *args, warmup=min(2, iters - 1), iters=iters)
    return dict(rung=name, mesh=mesh_name, fwd_bwd_ms=ms,
                rel_err=_rel_err(got, expected),
                all_gathers=compiled.as_text().count(" all-gather("))


def run_case(name: str, batch: int, length: int, shrink: int = 1,
             iters: int = 10) -> list[dict[str, Any]]:
    """The rows of one rung: `1 device`, `manual 1` and the meshes of the devices present."""
    devices = jax.devices()
    run, x, layouts = CASES[name](jax.random.key(0), batch, length,
                                  lambda n: max(1, n // shrink))
    ids = _segment_ids(batch, length)
    fn = _loss_and_grads(run, x, ids)
    one = fn.lower(x).compile()
    expected = one(x)
    rows = [_row(name, "1 device", one, (x,), expected, iters)]
    # A one-device mesh, manual over "data": the kernels run inside shard_map.
    mesh1 = make_mesh(MeshConfig(data=1), devices[:1])
    manual = jax.jit(jax.shard_map(fn, mesh=mesh1, in_specs=P("data"), out_specs=P("data"),
                                   axis_names={"data"}))
    with jax.set_mesh(mesh1):
        rows.append(_row(name, "manual 1", manual.lower(x).compile(), (x,), expected, iters))
    n = len(devices)
    meshes = [] if n < 2 else [MeshConfig(data=n)] + (
        [MeshConfig(data=n // 2, tensor=2)] if n % 2 == 0 else [])
    for config in meshes:
        mesh = make_mesh(config, devices)
        with jax.set_mesh(mesh):
            sharded = _loss_and_grads(run, x, jax.device_put(
                ids, NamedSharding(mesh, logical_to_spec(("batch", None)))))
            args = (_placed(x, layouts, mesh),)
            rows.append(_row(name, f"data={config.data} tensor={config.tensor}",
                             sharded.lower(*args).compile(), args, expected, iters))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--batch-per-device", type=int, default=2)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--rungs", default=",".join(CASES))
    parser.add_argument("--shrink", type=int, default=1,
                        help="divide every head count and width by this (smoke runs)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per row")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n = len(jax.devices())
    batch = args.batch_per_device * n
    out = args.out or f"experiments/benchmarks/results/sharded_kernels_{n}gpu.json"
    columns = ["rung", "mesh", "fwd_bwd_ms", "rel_err", "all_gathers", "error"]
    rows = []
    for name in args.rungs.split(","):
        try:
            case_rows = run_case(name, batch, args.length, args.shrink, args.iters)
        except Exception as e:  # noqa: BLE001  (report and go on with the next rung)
            case_rows = [dict(rung=name, error=error_text(e, None))]
        print_table(case_rows, columns)
        rows += case_rows
        # Saved as it goes: a command cut off at its time limit keeps the finished rungs.
        write_json(out, "sharded_kernels", rows, quiet=True, batch=batch, length=args.length,
                   shrink=args.shrink, devices=n)
    print()
    print_table(rows, columns)
    print(f"wrote {out}")


if __name__ == "__main__":
    run_with_logging(main)
