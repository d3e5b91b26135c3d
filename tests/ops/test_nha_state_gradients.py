"""NHA's chunked rung against its per-token reference: the gradients w.r.t. the whole initial
state, its ring of the last w tokens (keys, values, slot writes, gates, window keys) as well
as its slots (test_nha.py differentiates the slots only; the Pallas rung's are checked in
tests/pallas/test_nha_kernel.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.ops.nha import native_hybrid_attention
from tests.helpers import assert_close, normals
from tests.ops.test_nha import _inputs, _random_state

FIELDS = ("slot_keys", "slot_values", "keys", "values", "s", "g", "window_keys")


def test_xla_gradients_of_every_initial_state_array_match_reference(x64):
    """w = 5 over chunks of 4, T = 13 (the last chunk partial), GQA, packed documents; row 1's
    current document starts inside the ring (its ring entries before the start are dead)."""
    T, window = 13, 5
    args = _inputs(T, H=4, G=2, seed=20)
    segment_ids = jnp.asarray([[0] * 6 + [1] * 7, [0] * 13])
    base = _random_state(21, G=2, window=window, length=11)
    assert base._fields[:7] == FIELDS
    weights = normals(22, (2, T, 4, 4), (2, 2, 3, 3), (2, 2, 3, 4))

    def loss(impl, args, arrays):
        state = base._replace(**dict(zip(FIELDS, arrays, strict=True)))
        out, final = native_hybrid_attention(
            *args[:5], window=window, q_window=args[5], k_window=args[6],
            segment_ids=segment_ids, initial_state=state, return_final_state=True,
            chunk_size=4, implementation=impl)
        return (jnp.sum(weights[0] * out) + jnp.sum(weights[1] * final.slot_keys)
                + jnp.sum(weights[2] * final.slot_values))

    point = (args, tuple(base[:7]))
    grads = {impl: jax.jit(jax.value_and_grad(functools.partial(loss, impl), argnums=(0, 1)))(
        *point) for impl in ("reference", "xla")}
    assert_close(grads["xla"], grads["reference"], 1e-10, "xla vs reference")
    for name, grad in zip(FIELDS, grads["reference"][1][1], strict=True):
        assert np.linalg.norm(grad) > 1e-3, f"the initial {name} do not reach the loss"
