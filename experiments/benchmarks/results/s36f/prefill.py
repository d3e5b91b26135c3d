"""Session 36, call f: a forward alone (prefill) of the gated delta rule at few programs, the
V tiles of its state pass as they are against narrower ones (session 35's `s35c/prefill.py` at
two more head shapes): K = V = 128 at 16 heads (split forward, `forward_value_block` 64 → 32;
B 1 × 32768 launches 32 programs of 64 columns) and gdn-130m's K = V = 64 at 12 heads (fused
forward, `value_block` 64 → 32 → 16; B 1: 12 programs). Prints ms, writes prefill.json."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import device_name, time_compiled
from hybrid_jax.ops import l2_normalize
from pallas_kernels.delta_rule import api
from pallas_kernels.delta_rule.block_sizes import default_block_sizes

CASES = [  # heads, K = V, field, tiles, shapes
    (16, 128, "forward_value_block", (64, 32), ((1, 32768), (2, 16384), (4, 8192))),
    (12, 64, "value_block", (64, 32, 16), ((1, 32768), (4, 8192))),
]
rows = []
for heads, dim, field, tiles, shapes in CASES:
    base = default_block_sizes(dim, dim, training=False)
    for batch, length in shapes:
        keys = iter(jax.random.split(jax.random.key(0), 5))
        normal = lambda *s, keys=keys: jax.random.normal(next(keys), s, jnp.float32)  # noqa: E731
        q, k = (l2_normalize(normal(batch, length, heads, dim)).astype(jnp.bfloat16)
                for _ in range(2))
        v = normal(batch, length, heads, dim).astype(jnp.bfloat16)
        g = -jax.nn.softplus(normal(batch, length, heads))
        beta = jax.nn.sigmoid(normal(batch, length, heads))
        outs = {}
        for tile in tiles:
            blocks = dataclasses.replace(base, **{field: tile})
            fn = jax.jit(lambda *a, b=blocks: api.gated_delta_rule(*a, block_sizes=b)[0])
            row = dict(H=heads, K=dim, B=batch, T=length, field=field, tile=tile)
            try:
                outs[tile] = fn(q, k, v, g, beta).astype(jnp.float32)
                row["ms"] = time_compiled(fn, q, k, v, g, beta)
            except Exception as e:  # noqa: BLE001  (a tile that does not compile: report it)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
            rows.append(row)
            print(row, flush=True)
        diff = max(float(jnp.max(jnp.abs(o - outs[tiles[0]]))) for o in outs.values())
        print(f"H{heads} K{dim} B{batch}: max difference between tiles {diff:.3g}", flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "prefill.json"), "w") as f:
    json.dump({"device": device_name(), "rows": rows}, f, indent=1)
