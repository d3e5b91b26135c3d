"""Session 37, calls b, c and g: the gated delta rule's forward alone (prefill) at several V
tiles of one `BlockSizes` field, each tile timed `--rounds` times, interleaved in the given
order; outputs compared across tiles. Prints ms per round and the median, writes prefill.json.

    python3 experiments/benchmarks/results/s37b/prefill.py --dim 64 --field value_block \\
        --tiles 64,32,16 --shapes 12x1x32768,12x2x16384,12x4x8192,12x8x4096

(`run.sh` of each call holds its arguments; call b's JSON predates the `H` column.)"""

import argparse
import dataclasses
import json
import os
import statistics

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import device_name, time_compiled
from hybrid_jax.ops import l2_normalize
from pallas_kernels.delta_rule import api
from pallas_kernels.delta_rule.block_sizes import default_block_sizes

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dim", type=int, required=True, help="K = V")
parser.add_argument("--field", required=True, help="value_block or forward_value_block")
parser.add_argument("--tiles", type=lambda s: [int(t) for t in s.split(",")], required=True)
parser.add_argument("--shapes", required=True, help="HEADSxBxT,...")
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
dim, tiles_order = args.dim, args.tiles
rows = []
for shape in args.shapes.split(","):
    heads, batch, length = map(int, shape.split("x"))
    keys = iter(jax.random.split(jax.random.key(0), 5))
    normal = lambda *s, keys=keys: jax.random.normal(next(keys), s, jnp.float32)  # noqa: E731
    q, k = (l2_normalize(normal(batch, length, heads, dim)).astype(jnp.bfloat16) for _ in range(2))
    v = normal(batch, length, heads, dim).astype(jnp.bfloat16)
    g = -jax.nn.softplus(normal(batch, length, heads))
    beta = jax.nn.sigmoid(normal(batch, length, heads))
    default = default_block_sizes(dim, dim, training=False, sequences=batch * heads)
    base = default_block_sizes(dim, dim, training=False)
    blocks = {tile: dataclasses.replace(base, **{args.field: tile}) for tile in tiles_order}
    fns = {tile: jax.jit(lambda *a, b=b: api.gated_delta_rule(*a, block_sizes=b)[0])
           for tile, b in blocks.items()}
    outs = {tile: fn(q, k, v, g, beta).astype(jnp.float32) for tile, fn in fns.items()}
    times = {tile: [] for tile in tiles_order}
    for _ in range(args.rounds):
        for tile, fn in fns.items():
            times[tile].append(time_compiled(fn, q, k, v, g, beta))
    diff = max(float(jnp.max(jnp.abs(o - outs[tiles_order[0]]))) for o in outs.values())
    for tile in tiles_order:
        row = dict(H=heads, B=batch, T=length, programs=batch * heads * dim // 64, tile=tile,
                   default=getattr(default, args.field) == tile,
                   ms=statistics.median(times[tile]), rounds=times[tile], max_diff=diff)
        rows.append(row)
        print(row, flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "prefill.json"), "w") as f:
    json.dump({"device": device_name(), "rows": rows}, f, indent=1)
