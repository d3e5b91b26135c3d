"""Session 45, call c: context-parallel attention's heads-for-time form on one GPU — the
cuDNN and flash kernels inside a shard_map manual over a one-device `seq` axis (its
all_to_all and all_gather of size 1), values and gradients against the plain op (bf16; the
same kernels, so ≈ 0) and against the float32 reference (< 1e-2). One GPU cannot split time;
this checks that the form lowers and runs on the real kernels."""

import importlib

import jax
import jax.numpy as jnp

from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.sharding import make_mesh


def rel(a, b):
    return max(float(jnp.linalg.norm((x - y).astype(jnp.float32)) /
                     jnp.linalg.norm(y.astype(jnp.float32)))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def grads(fn, q, k, v):
    w = jax.random.normal(jax.random.key(9), (*q.shape[:3], v.shape[-1]), jnp.float32)
    loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)


cp_attention = importlib.import_module("hybrid_jax.ops.context_parallel.attention")
mesh = make_mesh(MeshConfig(data=1, seq=1), jax.devices()[:1])
B, T = 2, 4096
ids = jnp.cumsum(jax.random.uniform(jax.random.key(2), (B, T)) < 1e-3, axis=1, dtype=jnp.int32)
def check(name, H, G, D, Dv, segments, window):
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (B, T, h, d), jnp.float32).astype(jnp.bfloat16)
               for key, h, d in zip(keys, (H, G, G), (D, D, Dv), strict=True))
    extents = None if segments is None else ops.segment_extents(segments)
    kwargs = dict(window=window, segment_ids=segments)
    plain = lambda q, k, v: ops.attention(q, k, v, segment_extents=extents, **kwargs)
    reference = lambda q, k, v: ops.attention(q, k, v, implementation="reference", **kwargs)

    def split(q, k, v):
        return cp_attention._head_split(q, k, v, 1, "seq", scale=None, segment_extents=extents,
                                        implementation=None, **kwargs)

    try:
        rung = ops.attention_rung(q, k, v, segment_ids=segments, window=window)
        with jax.set_mesh(mesh):
            got = grads(split, q, k, v)
            text = str(jax.make_jaxpr(split)(q, k, v))
        want = grads(plain, q, k, v)
        ref = grads(reference, *(x.astype(jnp.float32) for x in (q, k, v)))
        print(f"{name}: rung {rung}, all_to_all in program {'all_to_all' in text}, "
              f"vs plain op {rel(got, want):.2e}, vs f32 reference {rel(got, ref):.2e}",
              flush=True)
    except Exception as error:  # noqa: BLE001  (a row per case)
        print(f"{name}: FAILED {type(error).__name__}: {str(error)[:600]}", flush=True)


check("packed gqa", 16, 4, 128, 128, ids, None)
check("packed window", 16, 4, 64, 64, ids, 512)
check("unpacked gqa", 16, 4, 128, 128, None, None)
check("oryx-mamba2 wide values", 1, 1, 128, 1536, ids, None)
