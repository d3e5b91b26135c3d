"""Mamba-2's state-space duality (SSD) recurrence: scalar decay per head, matrix state.

Per head h (using B/C group g = h // (H/G)), with state `S_t` of shape `[P, N]`:

    S_t = exp(dt_t·A_h) · S_{t−1} + dt_t · x_t B_tᵀ
    y_t = S_t C_t + D_h · x_t

(the D skip optional: Mamba-2's; the "pallas" rung adds it in the kernel that writes y, which
saves the model an XLA pass over y and x). Rungs: "pallas" (the kernels of
`pallas_kernels/ssd`, GPU or TPU), "xla" (the chunked four-step SSD algorithm of Dao & Gu
2024) and "reference" (per-token `lax.scan`, the definition); `ssd_step` is the decode step.
Decays, cumulative sums and states are float32 (float64 stays float64); y has x's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_dims, check_divides, check_floating, check_ssm_inputs
from hybrid_jax.ops.dispatch import Rung, backend, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.partition import shard_kernel
from hybrid_jax.ops.scan import (
    causal_decay_matrix,
    chunk_state_scan,
    compute_dtype,
    to_chunks,
    varying_scan,
)
from hybrid_jax.ops.segments import document_starts, reset_log_decay, reset_state
from pallas_kernels.ssd import api as pallas_ssd

_OP = "ssd"


@typed_like_inputs
def ssd(
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
    D: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The SSD recurrence over a sequence.

    Args:
      x: `[B, T, H, P]` inputs.
      dt: `[B, T, H]` positive step sizes (after softplus and bias).
      A: `[H]` negative decay rates (`−exp(A_log)`).
      B: `[B, T, G, N]` input projections; G divides H, head h reads group h // (H/G).
      C: `[B, T, G, N]` output projections.
      chunk_size: chunk length of the "xla" rung (T need not be a multiple); the "pallas"
        rung uses its tuned tiles (`pallas_kernels/ssd/block_sizes.py`).
      initial_state: `[B, H, P, N]` state before the first token; None for zeros.
      return_final_state: also return the state after the last token.
      segment_ids: `[B, T]` packed-document ids; the state resets at each document start
        (`hybrid_jax.ops.segments`).
      D: `[H]` skip weights, or None (no skip): y_t gains D_h·x_t, summed in float32 (or the
        compute dtype) with the state's readout and rounded once.
      implementation: "reference", "xla", "pallas" or None (auto: "pallas" on a GPU where the
        kernels take the call, e.g. head and state dims in 64/128/256; else "xla", logged).
        On a TPU "pallas" runs the Mosaic kernels (dims 64/128/256) only when named: they
        compile for TPUs but have not yet run on one, so auto takes "xla" there.

    Returns:
      y `[B, T, H, P]` in x's dtype; with `return_final_state`, `(y, final_state)` where
      final_state is `[B, H, P, N]` float32 (float64 for float64 inputs).
    """
    check_ssm_inputs(_OP, x, dt, A, B, C, chunk_size, initial_state, dt_layout="BTH",
                     A_layout="H")
    _check_skip(_OP, x, D)
    starts = document_starts(_OP, segment_ids, x.shape[0], x.shape[1])
    y, final_state = dispatch(_OP, _RUNGS, implementation, x, dt, A, B, C,
                              chunk_size=chunk_size, initial_state=initial_state, starts=starts,
                              D=D)
    return (y, final_state) if return_final_state else y


def _check_skip(op: str, x: jax.Array, D: jax.Array | None) -> None:
    if D is not None:
        check_dims(op, {"H": x.shape[-2]}, D=(D, "H"))
        check_floating(op, D=D)


def _plus_skip(y: jax.Array, x: jax.Array, D: jax.Array | None) -> jax.Array:
    """y + D_h·x (heads on axis −2) in y's (the compute) dtype; y itself without D."""
    return y if D is None else y + D.astype(y.dtype)[:, None] * x.astype(y.dtype)


def _by_group(a: jax.Array, num_groups: int, axis: int) -> jax.Array:
    """Splits the head axis H into [G, H/G] (head h -> group h // (H/G))."""
    shape = a.shape
    return a.reshape(shape[:axis] + (num_groups, shape[axis] // num_groups) + shape[axis + 1:])


@typed_like_inputs
def ssd_step(
    state: jax.Array, x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array,
    D: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One token of the recurrence (decoding).

    Args:
      state: `[B, H, P, N]` state before the token.
      x: `[B, H, P]`; dt: `[B, H]`; A: `[H]`; B, C: `[B, G, N]`; D: `[H]` skip or None.

    Returns:
      `(y [B, H, P] in x's dtype, new state [B, H, P, N] float32/float64)`.
    """
    sizes = check_dims(_OP + "_step", {}, state=(state, "BHPN"), x=(x, "BHP"), dt=(dt, "BH"),
                       A=(A, "H"), B=(B, "BGN"), C=(C, "BGN"))
    check_floating(_OP + "_step", state=state, x=x, dt=dt, A=A, B=B, C=C)
    _check_skip(_OP + "_step", x, D)
    check_divides(_OP + "_step", "num_groups must divide num_heads", sizes["G"], sizes["H"])
    dtype = compute_dtype(state, x, dt, A, B, C)
    G = sizes["G"]
    x_g, dt_g = (_by_group(a.astype(dtype), G, 1) for a in (x, dt))  # [b,g,r,p], [b,g,r]
    decay = jnp.exp(dt_g * _by_group(A.astype(dtype), G, 0))
    B, C = B.astype(dtype), C.astype(dtype)
    state_g = _by_group(state.astype(dtype), G, 1)  # [b,g,r,p,n]
    state_g = (decay[..., None, None] * state_g
               + jnp.einsum("bgrp,bgn->bgrpn", x_g * dt_g[..., None], B))
    y = jnp.einsum("bgrpn,bgn->bgrp", state_g, C).reshape(x.shape)
    return _plus_skip(y, x, D).astype(x.dtype), state_g.reshape(state.shape)


def ssd_reference(x, dt, A, B, C, *, chunk_size, initial_state, starts, D):
    """The definition: `ssd_step` token by token with `lax.scan`, the state zeroed at
    document starts."""
    del chunk_size
    batch, T, H, P = x.shape
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    if initial_state is None:
        initial_state = jnp.zeros((batch, H, P, B.shape[-1]), dtype)
    if starts is None:
        starts = jnp.zeros((batch, T), bool)

    def step(state, token):
        start, token = token[0], token[1:]
        y, state = ssd_step(reset_state(state, start), *token[:2], A, *token[2:], D)
        return state, y

    tokens = tuple(jnp.moveaxis(a, 1, 0) for a in (starts, x, dt, B, C))
    final_state, y = varying_scan(step, initial_state.astype(dtype), tokens, A, D)
    return jnp.moveaxis(y, 0, 1), final_state


def ssd_xla(x, dt, A, B, C, *, chunk_size, initial_state, starts, D):
    """Chunked SSD: quadratic attention-like form inside chunks, a state scan across chunks.

    Memory: O(T·H·(P + L)) for the within-chunk blocks plus O(T/L·H·P·N) chunk states; the
    state is never formed per token.
    """
    batch, T, H, P = x.shape
    G, N = B.shape[2:]
    dtype = compute_dtype(x, dt, A, B, C, initial_state)
    L = min(chunk_size, T)
    # Zero padding: dt = 0 gives decay exp(0) = 1 and input dt·x = 0, so padded steps keep the
    # state unchanged and their outputs are sliced off.
    x_c = _by_group(to_chunks(x.astype(dtype), L), G, 3)  # [b,c,l,g,r,p]
    dt_c = _by_group(to_chunks(dt.astype(dtype), L), G, 3)  # [b,c,l,g,r]
    B_c, C_c = (to_chunks(a.astype(dtype), L) for a in (B, C))  # [b,c,l,g,n]
    log_decay = reset_log_decay(dt.astype(dtype) * A.astype(dtype), starts)  # [b,t,h]
    cum_log_decay = jnp.cumsum(_by_group(to_chunks(log_decay, L), G, 3), axis=2)
    x_dt = x_c * dt_c[..., None]

    # 1. Within chunks: y_t = Σ_{s≤t} (C_t·B_s) exp(cum_t − cum_s) dt_s x_s.
    decay_ts = causal_decay_matrix(jnp.moveaxis(cum_log_decay, 2, -1))  # [b,c,g,r,t,s]
    scores = jnp.einsum("bctgn,bcsgn->bcgts", C_c, B_c)
    y_diag = jnp.einsum("bcgrts,bcsgrp->bctgrp", scores[:, :, :, None] * decay_ts, x_dt)

    # 2. Each chunk's own contribution to the state at its end.
    decay_to_end = jnp.exp(cum_log_decay[:, :, -1:] - cum_log_decay)  # [b,c,l,g,r]
    increments = jnp.einsum("bcsgrp,bcsgr,bcsgn->bcgrpn", x_dt, decay_to_end, B_c)

    # 3. Carry the state across chunks: the state entering each chunk.
    chunk_decay = jnp.exp(cum_log_decay[:, :, -1])[..., None, None]  # [b,c,g,r,1,1]
    init = None if initial_state is None else _by_group(initial_state.astype(dtype), G, 1)
    entering, final_state = chunk_state_scan(chunk_decay, increments, init, axis=1)

    # 4. The entering state, decayed to each step, read out by C_t.
    y_off = jnp.einsum("bctgn,bcgrpn,bctgr->bctgrp", C_c, entering, jnp.exp(cum_log_decay))

    y = (y_diag + y_off).reshape(batch, -1, H, P)[:, :T]
    return _plus_skip(y, x, D).astype(x.dtype), final_state.reshape(batch, H, P, N)


def ssd_pallas(x, dt, A, B, C, *, chunk_size, initial_state, starts, D):
    """The Pallas kernels on each device's batch and heads (A and the B/C groups split with
    the heads); they take document ids, so the starts become running ids. A zero initial
    state is passed in (not made by the kernels' entry point), so that under a mesh it is
    split like the other inputs."""
    del chunk_size  # the kernels' own tiles
    platform = backend()
    segment_ids = None if starts is None else jnp.cumsum(starts, axis=1, dtype=jnp.int32)
    if initial_state is None:
        initial_state = jnp.zeros(x.shape[:1] + x.shape[2:] + B.shape[3:], jnp.float32)

    def kernel(x, dt, A, B, C, segment_ids, initial_state, D):
        return pallas_ssd.ssd(x, dt, A, B, C, segment_ids=segment_ids,
                              initial_state=initial_state, D=D, backend=platform)

    return shard_kernel(_OP, kernel, (x, dt, A, B, C, segment_ids, initial_state, D),
                        ("BTHP", "BTH", "H", "BTGN", "BTGN", "BT", "BHPN", "H"),
                        ("BTHP", "BHPN"))


def _pallas_unsupported(x, dt, A, B, C, *, chunk_size, initial_state, starts, D
                        ) -> str | None:
    if backend() not in ("gpu", "tpu"):
        return f"needs a GPU or TPU backend, running on {backend()}"
    return pallas_ssd.unsupported(x, dt, A, B, C, initial_state=initial_state, D=D,
                                  backend=backend())


_RUNGS = (
    # Chosen automatically on GPUs only: the TPU kernels have run in TPU interpret mode and
    # compile for TPUs, never ran on one (pallas_kernels/ssd/NOTES.md, "TPU lowering");
    # `implementation="pallas"` runs them.
    Rung("pallas", ssd_pallas, _pallas_unsupported, auto_platforms=("gpu",)),
    Rung("xla", ssd_xla),
    Rung("reference", ssd_reference, auto=False),
)
