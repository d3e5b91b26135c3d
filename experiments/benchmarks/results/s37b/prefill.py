"""Session 37, call b: gdn-130m's forward alone (prefill; K = V = 64, 12 heads, the fused
forward) at its `value_block` 64 / 32 / 16, three rounds interleaved (session 36's one call at
B 4 × 8192 was not monotonic in the tile: 0.83 / 0.97 / 0.71 ms), at B 1, 2, 4, 8 (12 to 96
programs of 64 columns). Prints ms per round and the median, writes prefill.json."""

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

HEADS, DIM, TILES, ROUNDS = 12, 64, (64, 32, 16), 3
SHAPES = ((1, 32768), (2, 16384), (4, 8192), (8, 4096))
rows = []
for batch, length in SHAPES:
    keys = iter(jax.random.split(jax.random.key(0), 5))
    normal = lambda *s, keys=keys: jax.random.normal(next(keys), s, jnp.float32)  # noqa: E731
    q, k = (l2_normalize(normal(batch, length, HEADS, DIM)).astype(jnp.bfloat16) for _ in range(2))
    v = normal(batch, length, HEADS, DIM).astype(jnp.bfloat16)
    g = -jax.nn.softplus(normal(batch, length, HEADS))
    beta = jax.nn.sigmoid(normal(batch, length, HEADS))
    default = default_block_sizes(DIM, DIM, training=False, sequences=batch * HEADS)
    base = default_block_sizes(DIM, DIM, training=False)
    tiles = {tile: dataclasses.replace(base, value_block=tile) for tile in TILES}
    fns = {tile: jax.jit(lambda *a, b=b: api.gated_delta_rule(*a, block_sizes=b)[0])
           for tile, b in tiles.items()}
    outs = {tile: fn(q, k, v, g, beta).astype(jnp.float32) for tile, fn in fns.items()}
    times = {tile: [] for tile in TILES}
    for _ in range(ROUNDS):
        for tile, fn in fns.items():
            times[tile].append(time_compiled(fn, q, k, v, g, beta))
    diff = max(float(jnp.max(jnp.abs(o - outs[TILES[0]]))) for o in outs.values())
    for tile in TILES:
        row = dict(B=batch, T=length, programs=batch * HEADS * DIM // 64, tile=tile,
                   default=default.value_block == tile, ms=statistics.median(times[tile]),
                   rounds=times[tile], max_diff=diff)
        rows.append(row)
        print(row, flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "prefill.json"), "w") as f:
    json.dump({"device": device_name(), "rows": rows}, f, indent=1)
