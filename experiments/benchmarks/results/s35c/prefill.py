"""Session 35, call c: a forward alone (prefill, no gradient) of gdn-340m's gated delta rule
(H3, K 256, V 512 as two slices) with its forward state pass in V tiles of 64 (today's
`default_block_sizes(256, 256, training=False)`) against 32, at 24 / 48 / 96 programs of 64
columns (B 1 × 32768, B 2 × 16384, B 4 × 8192). Prints ms and writes prefill.json to $OUT."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import device_name, time_compiled
from hybrid_jax.ops import l2_normalize
from pallas_kernels.delta_rule import api
from pallas_kernels.delta_rule.block_sizes import default_block_sizes

rows = []
base = default_block_sizes(256, 256, training=False)
for batch, length in ((1, 32768), (2, 16384), (4, 8192)):
    keys = iter(jax.random.split(jax.random.key(0), 5))
    normal = lambda *s, keys=keys: jax.random.normal(next(keys), s, jnp.float32)  # noqa: E731
    q = l2_normalize(normal(batch, length, 3, 256)).astype(jnp.bfloat16)
    k = l2_normalize(normal(batch, length, 3, 256)).astype(jnp.bfloat16)
    v = normal(batch, length, 3, 512).astype(jnp.bfloat16)
    g, beta = -jax.nn.softplus(normal(batch, length, 3)), jax.nn.sigmoid(normal(batch, length, 3))
    outs = {}
    for tile in (64, 32):
        blocks = dataclasses.replace(base, forward_value_block=tile)
        fn = jax.jit(lambda *a, b=blocks: api.gated_delta_rule(*a, block_sizes=b)[0])
        outs[tile] = fn(q, k, v, g, beta)
        ms = time_compiled(fn, q, k, v, g, beta)
        rows.append(dict(B=batch, T=length, forward_value_block=tile, ms=ms))
        print(rows[-1], flush=True)
    diff = jnp.max(jnp.abs(outs[64].astype(jnp.float32) - outs[32].astype(jnp.float32)))
    print(f"B{batch}: max |V64 - V32| = {float(diff):.3g}", flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "prefill.json"), "w") as f:
    json.dump({"device": device_name(), "rows": rows}, f, indent=1)
