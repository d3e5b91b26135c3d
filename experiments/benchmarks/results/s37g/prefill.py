"""Session 37, call g: session 36's K 128 forward-alone rule (its split state pass at
`forward_value_block` 32 up to 64 programs of 64 columns, measured in one pass) timed as calls
b and c time K 64: 16 heads of K = V = 128 at B 1, 2, 4, tiles 32 / 64 three rounds each,
interleaved. Prints ms per round and the median, writes prefill.json."""

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

DIM, TILES, ROUNDS = 128, (32, 64), 3
SHAPES = ((16, 1, 32768), (16, 2, 16384), (16, 4, 8192))
rows = []
for heads, batch, length in SHAPES:
    keys = iter(jax.random.split(jax.random.key(0), 5))
    normal = lambda *s, keys=keys: jax.random.normal(next(keys), s, jnp.float32)  # noqa: E731
    q, k = (l2_normalize(normal(batch, length, heads, DIM)).astype(jnp.bfloat16) for _ in range(2))
    v = normal(batch, length, heads, DIM).astype(jnp.bfloat16)
    g = -jax.nn.softplus(normal(batch, length, heads))
    beta = jax.nn.sigmoid(normal(batch, length, heads))
    default = default_block_sizes(DIM, DIM, training=False, sequences=batch * heads)
    base = default_block_sizes(DIM, DIM, training=False)
    tiles = {tile: dataclasses.replace(base, forward_value_block=tile) for tile in TILES}
    fns = {tile: jax.jit(lambda *a, b=b: api.gated_delta_rule(*a, block_sizes=b)[0])
           for tile, b in tiles.items()}
    outs = {tile: fn(q, k, v, g, beta).astype(jnp.float32) for tile, fn in fns.items()}
    times = {tile: [] for tile in TILES}
    for _ in range(ROUNDS):
        for tile, fn in fns.items():
            times[tile].append(time_compiled(fn, q, k, v, g, beta))
    diff = max(float(jnp.max(jnp.abs(o - outs[TILES[0]]))) for o in outs.values())
    for tile in TILES:
        row = dict(H=heads, B=batch, T=length, programs=batch * heads * DIM // 64, tile=tile,
                   default=default.forward_value_block == tile, ms=statistics.median(times[tile]),
                   rounds=times[tile], max_diff=diff)
        rows.append(row)
        print(row, flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "prefill.json"), "w") as f:
    json.dump({"device": device_name(), "rows": rows}, f, indent=1)
