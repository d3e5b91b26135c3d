"""NHA with GQA, heads split over `tensor` under explicit axes, differentiated with its final
state: does XLA's partitioner fail here too (JAX of this machine, CPU devices)?"""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax
import jax.numpy as jnp

import tests.ops.test_explicit_axes_ops as t
from hybrid_jax import ops

B, T, H, K, V, M = t.B, t.T, t.H, t.K, t.V, t.M
arrays = (t._normal(B, T, H, K), t._normal(B, T, 2, K), t._normal(B, T, 2, V),
          1 - jnp.exp(t.GATE[:, :, :2]), t.GATE[:, :, :2], t.SEGMENTS)
print("jax", jax.__version__, jax.devices()[0].platform)
for final in (True, False):
    def op(q, k, v, s, g, ids, final=final):
        return ops.native_hybrid_attention(q, k, v, s, g, window=3, segment_ids=ids,
                                           return_final_state=final)

    grads = jax.jit(jax.grad(lambda *a, op=op: t._loss(op, *a), argnums=(0, 1, 2, 3, 4)))
    want = grads(*arrays)
    with jax.set_mesh(jax.make_mesh((2, 2), ("data", "tensor"), devices=jax.devices()[:4])):
        split = jax.tree.map(t._split, arrays)
        try:
            got = grads(*split)
            err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
                jax.tree.leaves(got), jax.tree.leaves(want), strict=True))
            print(f"final state {final}: OK, max error {err:.2e}")
        except Exception as e:  # noqa: BLE001
            print(f"final state {final}: FAIL {str(e)[:120]}")
