"""NHA by definition, for tests and benchmark checks: a per-token `lax.scan` (differentiable).

Token t − w enters the slots at step t; the query then attends to the slot logits and to every
key masked to its window t−w+1..t under one softmax. O(T²) work; small shapes only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def nha_reference(q, k, v, s, g, *, window: int, scale: float | None = None, q_window=None,
                  k_window=None, empty_slots: str = "mask") -> jax.Array:
    """Same arguments and result as `api.native_hybrid_attention`, in the inputs' dtype (use
    float32 or float64 inputs for a reference)."""
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    batch, length, heads, key_dim = q.shape
    group = heads // k.shape[2]
    k, v, s, g, k_window = (jnp.repeat(a, group, axis=2) for a in (k, v, s, g, k_window))
    enter = [jnp.pad(a, [(0, 0), (window, 0), (0, 0), (0, 0)])[:, :length] for a in (k, v, s, g)]
    position = jnp.arange(length)
    slots = s.shape[3]

    def step(state, xs):
        slot_keys, slot_values = state
        t, q_t, qw_t, k_in, v_in, s_in, g_in = xs
        decay = jnp.exp(g_in)
        slot_keys = slot_keys * decay[:, :, None, :] + k_in[..., :, None] * s_in[..., None, :]
        slot_values = decay[..., None] * slot_values + s_in[..., :, None] * v_in[..., None, :]
        slot_logits = scale * jnp.einsum("bhkm,bhk->bhm", slot_keys, q_t)
        window_logits = scale * jnp.einsum("bjhd,bhd->bhj", k_window, qw_t)
        in_window = (position > t - window) & (position <= t)
        visible = (t >= window) | (empty_slots == "sink")
        logits = jnp.concatenate([jnp.where(visible, slot_logits, -jnp.inf),
                                  jnp.where(in_window[None, None], window_logits, -jnp.inf)], -1)
        p = jax.nn.softmax(logits, axis=-1)
        out = (jnp.einsum("bhmv,bhm->bhv", slot_values, p[..., :slots])
               + jnp.einsum("bjhv,bhj->bhv", v, p[..., slots:]))
        return (slot_keys, slot_values), out

    init = (jnp.zeros((batch, heads, key_dim, slots), q.dtype),
            jnp.zeros((batch, heads, slots, v.shape[3]), q.dtype))
    xs = [jnp.moveaxis(a, 1, 0) for a in (q, q_window, *enter)]
    _, out = jax.lax.scan(step, init, (position, *xs))
    return jnp.moveaxis(out, 0, 1)
