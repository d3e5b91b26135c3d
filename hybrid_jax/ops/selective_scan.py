"""Mamba-1's selective scan (S6): a diagonal state per channel, decays per (channel, state).

Per head h and channel p (using B/C group g = h // (H/G)), with state `s_t` of shape `[N]`:

    s_t = exp(dt_t·A_{h,p}) ⊙ s_{t−1} + (dt_t · x_t) B_t      (dt_t, x_t: scalars of (h, p))
    y_t = s_t · C_t

(no D skip; the module adds it). Mamba-1 itself is H = 1 head of P = d_inner channels with one
group of B/C. Unlike SSD the decay differs per state entry, so there is no attention-like form
inside a chunk: the "xla" rung runs an associative scan over each chunk and carries the state
from chunk to chunk with `lax.scan`, rematerialising the per-token states of a chunk in the
backward pass, so memory is O(T·H·P) plus O(T/L·H·P·N) chunk states (never O(T·H·P·N)).
"reference" is the per-token `lax.scan` (the definition); `selective_scan_step` decodes one
token. Decays and states are float32 (float64 stays float64); y has x's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_dims, check_divides, check_floating, check_ssm_inputs
from hybrid_jax.ops.dispatch import Rung, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.scan import compute_dtype, linear_scan, to_chunks, varying_scan
from hybrid_jax.ops.segments import document_starts, reset_decay, reset_state

_OP = "selective_scan"


@typed_like_inputs
def selective_scan(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    *,
    chunk_size: int = 64,
    initial_state: jax.Array | None = None,
    return_final_state: bool = False,
    segment_ids: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The selective scan over a sequence.

    Args:
      x: `[B, T, H, P]` inputs.
      dt: `[B, T, H, P]` positive step sizes (after softplus and bias), one per channel.
      A: `[H, P, N]` negative decay rates (`−exp(A_log)`).
      B: `[B, T, G, N]` input projections; G divides H, head h reads group h // (H/G).
      C: `[B, T, G, N]` output projections.
      chunk_size: chunk length of the "xla" rung (T need not be a multiple).
      initial_state: `[B, H, P, N]` state before the first token; None for zeros.
      return_final_state: also return the state after the last token.
      segment_ids: `[B, T]` packed-document ids; the state resets at each document start
        (`hybrid_jax.ops.segments`).
      implementation: "reference", "xla" or None (auto: "xla").

    Returns:
      y `[B, T, H, P]` in x's dtype; with `return_final_state`, `(y, final_state)` where
      final_state is `[B, H, P, N]` float32 (float64 for float64 inputs).
    """
    check_ssm_inputs(_OP, x, dt, A, B, C, chunk_size, initial_state, dt_layout="BTHP",
                     A_layout="HPN")
    starts = document_starts(_OP, segment_ids, x.shape[0], x.shape[1])
    y, final_state = dispatch(_OP, _RUNGS, implementation, x, dt, A, B, C,
                              chunk_size=chunk_size, initial_state=initial_state, starts=starts)
    return (y, final_state) if return_final_state else y


def _per_head(bc: jax.Array, num_heads: int, axis: int) -> jax.Array:
    """Repeats the group axis of B or C to one entry per head (head h reads h // (H/G))."""
    return jnp.repeat(bc, num_heads // bc.shape[axis], axis=axis)


@typed_like_inputs
def selective_scan_step(
    state: jax.Array, x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One token of the recurrence (decoding).

    Args:
      state: `[B, H, P, N]` state before the token.
      x, dt: `[B, H, P]`; A: `[H, P, N]`; B, C: `[B, G, N]`.

    Returns:
      `(y [B, H, P] in x's dtype, new state [B, H, P, N] float32/float64)`.
    """
    op = _OP + "_step"
    sizes = check_dims(op, {}, state=(state, "BHPN"), x=(x, "BHP"), dt=(dt, "BHP"),
                       A=(A, "HPN"), B=(B, "BGN"), C=(C, "BGN"))
    check_floating(op, state=state, x=x, dt=dt, A=A, B=B, C=C)
    check_divides(op, "num_groups must divide num_heads", sizes["G"], sizes["H"])
    dtype = compute_dtype(state, x, dt, A, B, C)
    H = sizes["H"]
    dt = dt.astype(dtype)
    B, C = (_per_head(a.astype(dtype), H, 1)[:, :, None] for a in (B, C))  # [b,h,1,n]
    state = (jnp.exp(dt[..., None] * A.astype(dtype)) * state.astype(dtype)
             + (dt * x.astype(dtype))[..., None] * B)
    y = jnp.sum(state * C, axis=-1)
    return y.astype(x.dtype), state


def selective_scan_reference(x, dt, A, B, C, *, chunk_size, initial_state, starts):
    """The definition: `selective_scan_step` token by token with `lax.scan`, the state zeroed
    at document starts."""
    del chunk_size
    batch, T, H, P = x.shape
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    if initial_state is None:
        initial_state = jnp.zeros((batch, H, P, A.shape[-1]), dtype)
    if starts is None:
        starts = jnp.zeros((batch, T), bool)

    def step(state, token):
        start, token = token[0], token[1:]
        y, state = selective_scan_step(reset_state(state, start), *token[:2], A, *token[2:])
        return state, y

    tokens = tuple(jnp.moveaxis(a, 1, 0) for a in (starts, x, dt, B, C))
    final_state, y = varying_scan(step, initial_state.astype(dtype), tokens, A)
    return jnp.moveaxis(y, 0, 1), final_state


def selective_scan_xla(x, dt, A, B, C, *, chunk_size, initial_state, starts):
    """Chunks of `chunk_size` steps: an associative scan inside, the state carried across."""
    batch, T, H, P = x.shape
    N = A.shape[-1]
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    L = min(chunk_size, T)
    # Zero padding: dt = 0 gives decay exp(0) = 1 and input 0, so padded steps keep the state
    # unchanged (the final state is exact) and their outputs are sliced off.
    x_c, dt_c = (jnp.moveaxis(to_chunks(a.astype(dtype), L), 1, 0) for a in (x, dt))
    B_c, C_c = (jnp.moveaxis(to_chunks(_per_head(a.astype(dtype), H, 2), L), 1, 0)
                for a in (B, C))  # [c,b,l,h,n]
    A = A.astype(dtype)
    starts_c = jnp.moveaxis(to_chunks(jnp.zeros((batch, T), bool) if starts is None else starts,
                                      L), 1, 0)  # [c,b,l]

    @jax.checkpoint  # the backward pass recomputes a chunk's states instead of storing them
    def chunk(state, inputs):
        x_l, dt_l, B_l, C_l, starts_l = inputs  # [b,l,h,p], [b,l,h,p], [b,l,h,n] x2, [b,l]
        decay = reset_decay(jnp.exp(dt_l[..., None] * A), starts_l)  # [b,l,h,p,n]
        states = linear_scan(decay, (dt_l * x_l)[..., None] * B_l[:, :, :, None], state, axis=1)
        y = jnp.einsum("blhpn,blhn->blhp", states, C_l)
        return states[:, -1], y

    if initial_state is None:
        initial_state = jnp.zeros((batch, H, P, N), dtype)
    xs = (x_c, dt_c, B_c, C_c, starts_c)
    final_state, y = varying_scan(chunk, initial_state.astype(dtype), xs, A)
    y = jnp.moveaxis(y, 0, 1).reshape(batch, -1, H, P)[:, :T]
    return y.astype(x.dtype), final_state


_RUNGS = (
    Rung("xla", selective_scan_xla),
    Rung("reference", selective_scan_reference, auto=False),
)
