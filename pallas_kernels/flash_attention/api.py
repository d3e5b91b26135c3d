"""Causal / sliding-window flash attention over packed documents: entry point, support checks,
custom VJP.

    o_t = Σ_s softmax_s(scale·q_t·k_s) v_s  over keys s ≤ t, t − s < w (window), seg_s = seg_t

Queries `[B, T, H, D]`, keys and values `[B, T, G, D]` (G | H: grouped-query attention),
segment ids `[B, T]` int (None: one document per row). Every query sees itself, so no row is
empty. The kernels skip every key block that no query of a block can see (causal, window and
documents: `bounds.py`), so packed and windowed attention cost less than full causal.

`active_queries` `[B, T]` bool marks the rows whose output is wanted (Oryx's attention-mode
tokens); the others are 0 (so they pass no gradient), and the kernels skip the query blocks
that hold none of them, forward and backward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import target
from pallas_kernels.flash_attention import gpu
from pallas_kernels.flash_attention.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.flash_attention.bounds import (
    Extents,
    document_extents,
    pad_extents,
    visible_span,
)
from pallas_kernels.flash_attention.checks import unsupported_arguments, unsupported_on
from pallas_kernels.flash_attention.reference import flash_attention_reference
from pallas_kernels.residuals import saved

IMPLEMENTATIONS = ("gpu", "reference")
_ACCELERATOR_DTYPES = (jnp.bfloat16, jnp.float16)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None = None,
    *,
    extents: Extents | None = None,
    active_queries: jax.Array | None = None,
    window: int | None = None,
    scale: float | None = None,
    block_sizes: BlockSizes | None = None,
    implementation: str | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Causal attention (window `w`: keys t−w+1..t) within documents; differentiable.

    Args:
      q: `[B, T, H, D]`; k, v: `[B, T, G, D]` with G dividing H.
      segment_ids: `[B, T]` integer document ids, or None.
      extents: `bounds.document_extents(segment_ids)` when the caller has it (a model computes
        it once per batch for all its layers), else computed here.
      active_queries: `[B, T]` bool, the rows computed (module docstring); None: every row.
      window: w >= 1, or None for full causal.
      scale: logit scale, default `D**-0.5`.
      block_sizes: tiles (default `default_block_sizes(D)`).
      implementation: "gpu" (the Pallas kernels), "reference" (XLA, O(T²) memory) or None:
        the kernels when the target platform (`pallas_kernels.target`) is a GPU or when
        interpreting, else the reference.
      interpret: run the kernels in Pallas interpret mode (CPU tests).

    Returns:
      `[B, T, H, D]` in the dtype of q.
    """
    if implementation is None:
        implementation = "gpu" if interpret or target.platform() == "gpu" else "reference"
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"pallas flash_attention: implementation must be one of "
                         f"{IMPLEMENTATIONS} or None, got {implementation!r}")
    reason = unsupported(q, k, v, segment_ids, window=window, extents=extents,
                         active_queries=active_queries,
                         interpret=interpret or implementation == "reference")
    if reason is not None:
        raise ValueError(f"pallas flash_attention: {reason}")
    batch, length = q.shape[:2]
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    if window is not None and window >= length:
        window = None  # the band covers the whole causal triangle
    if implementation == "reference":
        ids = jnp.zeros((batch, length), jnp.int32) if segment_ids is None else segment_ids
        out = flash_attention_reference(q, k, v, ids, window=window, scale=scale)
        return out if active_queries is None else jnp.where(active_queries[..., None, None],
                                                            out, 0).astype(out.dtype)
    if extents is None:  # one document (segment_ids None) needs no sort
        extents = document_extents(segment_ids, (batch, length))
    segment_ids = (jnp.zeros((batch, length), jnp.int32) if segment_ids is None
                   else segment_ids.astype(jnp.int32))
    blocks = block_sizes or default_block_sizes(q.shape[-1])
    st = gpu.Static(window=window, scale=scale, group=q.shape[2] // k.shape[2], blocks=blocks,
                    interpret=interpret, active_queries=active_queries is not None)
    padded = -(-length // blocks.time_multiple) * blocks.time_multiple
    # Padding goes after every real token and joins the last document: causal masking keeps it
    # out of real rows, and the padded rows' dO is zero.
    pad = lambda x: jnp.pad(x, [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2),
                            mode="edge" if x.ndim == 2 else "constant")
    spans = visible_span(pad_extents(extents, padded), window)
    active = None
    if active_queries is not None:  # the padded rows are inactive too
        active = jnp.pad(active_queries.astype(jnp.int32), [(0, 0), (0, padded - length)])
        # An inactive row's lowest key past the end: a block of such rows visits no key block.
        spans = (jnp.where(active != 0, spans[0], padded), *spans[1:])
    out = _flash(st, pad(q), pad(k), pad(v), pad(segment_ids), active, *spans)
    return out[:, :length]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st, q, k, v, segment_ids, active, *spans):
    return gpu.forward(q, k, v, segment_ids, active, spans, st)[0]


def _flash_fwd(st, q, k, v, segment_ids, active, *spans):
    o, lse = saved(*gpu.forward(q, k, v, segment_ids, active, spans, st))
    return o, (q, k, v, o, lse, segment_ids, active, spans)


def _flash_bwd(st, residuals, do):
    q, k, v, o, lse, segment_ids, active, spans = residuals
    dq, dk, dv = gpu.backward(q, k, v, o, lse, do, segment_ids, active, spans, st)
    return (dq, dk, dv, None, None) + (None,) * len(spans)


_flash.defvjp(_flash_fwd, _flash_bwd)


def unsupported(q, k, v, segment_ids=None, *, window=None, extents=None, active_queries=None,
                interpret=False) -> str | None:
    """None when the kernels can run this call, else the reason. `interpret`: no accelerator
    limits (dtype, head dims), as in interpret mode and for the reference."""
    reason = unsupported_arguments(q, k, v, segment_ids, window)
    if reason is not None:
        return reason
    batch, length, _, head_dim = q.shape
    if extents is not None:
        if segment_ids is None:
            return "extents need the segment_ids they were computed from"
        if not isinstance(extents, Extents) or any(
                x.shape != (batch, length) for x in extents):
            return (f"extents must be bounds.Extents of [B, T] = [{batch}, {length}] arrays, "
                    f"got {jax.tree.map(jnp.shape, extents)}")
    if active_queries is not None and (active_queries.shape != (batch, length)
                                       or active_queries.dtype != jnp.bool_):
        return (f"active_queries must be bool [B, T] = [{batch}, {length}], got "
                f"{active_queries.dtype} {active_queries.shape}")
    if not interpret:
        return unsupported_on("GPU", q, k, v, _ACCELERATOR_DTYPES)
    if head_dim < 8 or head_dim & (head_dim - 1):
        return f"head_dim must be a power of two >= 8, got {head_dim}"
    return None
