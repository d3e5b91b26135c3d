"""Mamba-2's SSD recurrence with Pallas kernels: entry point, support checks, custom VJP.

Per head h (B/C group g = h // (H/G)), state `S_t` `[P, N]`:

    S_t = exp(dt_t·A_h)·S_{t−1} + dt_t·x_t B_tᵀ,    y_t = S_t C_t (+ D_h·x_t)

with Mamba-2's D skip optional (the GPU kernel that writes y adds it before its one rounding),
and packed documents (`segment_ids`: a token whose id differs from the previous one starts a
document; the state is zero before it, and the first token of the call continues
`initial_state`). This is the contract of `hybrid_jax.ops.ssd` (whose "pallas" rung calls
`ssd` here). Decays, cumulative sums and states are float32; matmul operands are the input
dtype (bf16 on the GPU: states at chunk boundaries are stored, and read out, in bf16).
Long rows run as S sequence segments (`BlockSizes.segments`): the kernels on `[B·S, T/S]`,
then `segments.combine` adds each segment's entering state exactly (NOTES.md, round 3).
Two kernel sets with one contract: `gpu.py` (Triton lowering) and `tpu.py` (Mosaic TPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import target
from pallas_kernels.residuals import saved
from pallas_kernels.ssd import gpu, segments, tpu
from pallas_kernels.ssd.block_sizes import BlockSizes, Static, default_block_sizes
from pallas_kernels.vma import varying_like

DIMS = (64, 128, 256)
_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
_TPU_DTYPES = (jnp.bfloat16, jnp.float32)
_KERNELS = dict(gpu=gpu, tpu=tpu)


def ssd(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    initial_state: jax.Array | None = None,
    D: jax.Array | None = None,
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The SSD recurrence (differentiable in every array input).

    Args:
      x: `[B, T, H, P]`; dt: `[B, T, H]` positive steps; A: `[H]` negative rates;
      B, C: `[B, T, G, N]`, G dividing H.
      segment_ids: `[B, T]` integer document ids, or None (one document per row).
      initial_state: `[B, H, P, N]`, or None for zeros.
      D: `[H]` skip weights (Mamba-2's D), or None: y_t + D_h·x_t. The GPU kernels add it in
        float32 before y's rounding; on a TPU XLA adds it to the kernels' y.
      block_sizes: tiles and sequence segments (default `default_block_sizes(P, N, backend,
        itemsize=x.dtype.itemsize)`; its `segments` None: chosen by
        `segments.choose_segments` on a GPU, 1 on a TPU or interpreted).
      backend: "gpu" or "tpu" kernels; default: the platform, or "gpu" when interpreting on
        the CPU.
      interpret: run the kernels in Pallas interpret mode (CPU tests; the TPU kernels in TPU
        interpret mode).

    Returns:
      `(y [B, T, H, P] in x's dtype, final state [B, H, P, N] float32)`.
    """
    reason = unsupported(x, dt, A, B, C, segment_ids=segment_ids, initial_state=initial_state,
                         D=D, backend=backend, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas ssd: {reason}")
    backend = backend or _platform(interpret)
    batch, length, heads, head_dim = x.shape
    groups, state_dim = B.shape[2:]
    blocks = (block_sizes or default_block_sizes(head_dim, state_dim, backend,
                                                 itemsize=x.dtype.itemsize)).for_dims(head_dim)
    chunk = blocks.chunk
    num_chunks = -(-length // chunk)
    S = blocks.segments or (1 if interpret or backend == "tpu" else segments.choose_segments(
        batch * heads * (head_dim // blocks.block_p), num_chunks, segments.sm_count()))
    padded = -(-num_chunks // S) * S * chunk  # S segments of whole chunks
    pad = lambda v: jnp.pad(v, [(0, 0), (0, padded - length)] + [(0, 0)] * (v.ndim - 2))
    # Padding: dt = 0 (decay 1, no input) leaves the state unchanged; its outputs are cut off.
    dt = pad(dt.astype(jnp.float32))
    log_decay = dt * A.astype(jnp.float32)
    starts = doc = None
    if segment_ids is not None:
        # Starts of the whole row (a segment's first token may start a document; the row's
        # first token never does: it continues initial_state).
        starts = pad(jnp.concatenate([jnp.zeros((batch, 1), bool),
                                      segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1))
        # A document's first log decay is never read (chunk_math): 0, and no gradient.
        log_decay = jnp.where(starts[..., None], 0.0, log_decay)
        doc = jnp.cumsum(starts.reshape(-1, chunk), axis=1, dtype=jnp.int32).reshape(
            batch * S, padded // S)
    rows = lambda v: segments.split(pad(v), S)  # [B, T, ...] -> [B·S, Tp/S, ...]
    head_major = lambda v: segments.split(v, S).transpose(0, 2, 1)  # -> [B·S, H, Tp/S]
    if initial_state is None:
        s0 = jnp.zeros((batch * S, heads, head_dim, state_dim), jnp.float32)
    else:  # segment 0 continues initial_state, every other one starts from zero
        s0 = initial_state.astype(jnp.float32)[:, None]
        s0 = jnp.pad(s0, [(0, 0), (0, S - 1), (0, 0), (0, 0), (0, 0)]).reshape(
            (batch * S,) + s0.shape[2:])
    s0 = varying_like(s0, x, dt, B, C)  # a zero or replicated state, per-device rows
    st = Static(blocks=blocks, group=heads // groups, documents=doc is not None,
                interpret=interpret)
    C = pad(C.astype(x.dtype))
    skip = None if D is None else D.astype(jnp.float32)
    y, final_state = _core(st, backend, rows(x), head_major(dt), head_major(log_decay),
                           rows(B.astype(x.dtype)), segments.split(C, S), doc, s0, skip)
    if S > 1:
        y, final_state = segments.combine(y, final_state, log_decay, starts, C, S)
    else:
        y = y.reshape(batch, padded, heads, head_dim)
    return y[:, :length], final_state


def _forward(st, backend, x, dt, a, B, C, doc, s0, skip, *, store_states):
    """The backend's forward kernels; the skip inside the GPU's, after the TPU's."""
    if backend == "gpu":
        return gpu.forward(x, dt, a, B, C, doc, s0, st, store_states=store_states, skip=skip)
    y, *rest = tpu.forward(x, dt, a, B, C, doc, s0, st, store_states=store_states)
    if skip is not None:
        y = (y.astype(jnp.float32) + skip[:, None] * x.astype(jnp.float32)).astype(y.dtype)
    return y, *rest


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _core(st, backend, x, dt, a, B, C, doc, s0, skip):
    return tuple(_forward(st, backend, x, dt, a, B, C, doc, s0, skip, store_states=False))


def _core_fwd(st, backend, x, dt, a, B, C, doc, s0, skip):
    y, final_state, states = saved(*_forward(st, backend, x, dt, a, B, C, doc, s0, skip,
                                             store_states=True))
    return (y, final_state), (x, dt, a, B, C, doc, states, skip)


def _core_bwd(st, backend, residuals, cotangents):
    kernels = _KERNELS[backend]
    x, dt, a, B, C, doc, states, skip = residuals
    dy, d_final = cotangents
    dy = dy.astype(x.dtype)
    d_states, d_initial, kept = kernels.state_grads(dy, a, C, doc, states,
                                                    d_final.astype(jnp.float32), st)
    dx, d_dt, d_a, dB, dC = kernels.chunk_grads(x, dt, a, B, C, doc, dy, states, d_states,
                                                kept, st)
    d_skip = None
    if skip is not None:  # y += skip_h·x: XLA fuses both sums into one pass over dy and x
        dy32 = dy.astype(jnp.float32)
        dx = (dx.astype(jnp.float32) + skip[:, None] * dy32).astype(dx.dtype)
        d_skip = jnp.einsum("bthp,bthp->h", dy32, x.astype(jnp.float32))
    return dx, d_dt, d_a, dB.astype(B.dtype), dC.astype(C.dtype), None, d_initial, d_skip


_core.defvjp(_core_fwd, _core_bwd)


def unsupported(x, dt, A, B, C, *, segment_ids=None, initial_state=None, D=None, backend=None,
                interpret=False) -> str | None:
    """None when the kernels can run this call, else the reason. `backend` as in `ssd`. On an
    accelerator: head and state dims in `DIMS`; bf16 / f16 / f32 inputs on the GPU, bf16 / f32
    on a TPU; interpreted (either backend): any power-of-two dims (the tiles, powers of two
    clipped to P, then divide P)."""
    if x.ndim != 4 or dt.ndim != 3 or A.ndim != 1 or B.ndim != 4 or C.ndim != 4:
        return (f"expected x [B, T, H, P], dt [B, T, H], A [H], B and C [B, T, G, N]; got "
                f"shapes {x.shape}, {dt.shape}, {A.shape}, {B.shape}, {C.shape}")
    batch, length, heads, head_dim = x.shape
    groups, state_dim = B.shape[2:]
    if 0 in x.shape + B.shape:
        return f"x, B, C must not be empty, got shapes {x.shape}, {B.shape}, {C.shape}"
    if dt.shape != (batch, length, heads) or A.shape != (heads,):
        return f"dt must be {(batch, length, heads)} and A {(heads,)}, got {dt.shape}, {A.shape}"
    if B.shape[:2] != (batch, length) or C.shape != B.shape:
        return f"B and C must both be [{batch}, {length}, G, N], got {B.shape} and {C.shape}"
    if heads % groups:
        return f"groups G={groups} must divide heads H={heads}"
    if D is not None and D.shape != (heads,):
        return f"D must be [H] = {(heads,)}, got {D.shape}"
    if initial_state is not None and initial_state.shape != (batch, heads, head_dim, state_dim):
        return (f"initial_state must be {(batch, heads, head_dim, state_dim)}, got "
                f"{initial_state.shape}")
    if segment_ids is not None and (segment_ids.shape != (batch, length)
                                    or not jnp.issubdtype(segment_ids.dtype, jnp.integer)):
        return (f"segment_ids must be integer [{batch}, {length}], got {segment_ids.dtype} "
                f"{segment_ids.shape}")
    arrays = dict(x=x, dt=dt, A=A, B=B, C=C, initial_state=initial_state, D=D)
    for name, array in arrays.items():
        if array is not None and array.dtype not in _DTYPES:
            return f"{name} has dtype {array.dtype}; the kernels take bfloat16, float16, float32"
    platform = backend or _platform(interpret)
    if platform not in _KERNELS:
        return (f"no Pallas SSD kernels for platform {platform!r}, the target platform is "
                f"{target.platform()} (interpret=True runs them on the CPU)")
    if interpret:
        if any(d & (d - 1) for d in (head_dim, state_dim)):
            return f"P={head_dim} and N={state_dim} must be powers of two"
        return None
    if _platform(False) != platform:
        return (f"the {platform.upper()} kernels were asked for, the target platform is "
                f"{target.platform()}")
    if head_dim not in DIMS or state_dim not in DIMS:
        return f"head dim P={head_dim} and state dim N={state_dim} must be in {DIMS}"
    if platform == "tpu":
        for name, array in arrays.items():
            if array is not None and array.dtype not in _TPU_DTYPES:
                return f"{name} has dtype {array.dtype}; the TPU kernels take bfloat16, float32"
    return None


def _platform(interpret: bool) -> str:
    """The kernels of the target platform (`target.platform`); interpreting on the CPU, the GPU
    kernels."""
    platform = target.platform()
    return "gpu" if interpret and platform == "cpu" else platform
