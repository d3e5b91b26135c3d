"""Native hybrid attention (NHA) with Pallas kernels: entry point, support checks, custom VJP.

Per step t and query head (kv head ⌊h·G/H⌋ for GQA), window w ≥ 0, M slots:

    slots   K̃, Ṽ: gated-slot recurrence over the tokens ≤ t − w
            (K̃_j = K̃_{j−1}·diag(e^{g_j}) + k_j s_jᵀ,  Ṽ_j = diag(e^{g_j})·Ṽ_{j−1} + s_j v_jᵀ)
    logits  [scale·K̃ᵀq_t ; scale·q̂_t·k̂_j for j in t−w+1..t], ONE softmax (float32)
    output  o_t = Ṽᵀ p_slots + Σ_j p_j v_j

While no token has entered the slots (t < w) the slot logits are left out
(`empty_slots="mask"`) or count as M zero-value sinks with logit 0 (`"sink"`). This is the
contract of `hybrid_jax.ops.native_hybrid_attention` for calls without `segment_ids` and
without `initial_state` (the op's dispatcher checks those before choosing this rung).

How: the slot inputs are delayed by w steps (token j enters at step j + w) and time is padded
to a multiple of the tiles. A per-chunk kernel computes each chunk's writes; a scan over chunks
turns them into the slot states at chunk boundaries (O(T/C·K·M) floats, never a state per token);
a per-chunk kernel turns them into the slot logits; the window kernel starts its online softmax
from those logits and visits only the key blocks that intersect each query block's windows; a
per-chunk kernel adds the slot values with the final softmax weights. The backward pass
recomputes the window probabilities from the saved log-sum-exp. Memory is linear in T. See
NOTES.md for the measured times and the roofline.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.nha.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.nha.layout import Static

EMPTY_SLOTS = ("mask", "sink")
_ACCELERATOR_DTYPES = (jnp.bfloat16, jnp.float16)
_ACCELERATOR_DIMS = (64, 128)


def native_hybrid_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    s: jax.Array,
    g: jax.Array,
    *,
    window: int,
    scale: float | None = None,
    q_window: jax.Array | None = None,
    k_window: jax.Array | None = None,
    empty_slots: str = "mask",
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
    interpret: bool = False,
) -> jax.Array:
    """NHA forward (differentiable) with the Pallas kernels.

    Args:
      q: `[B, T, H, K]` slot-branch queries; k `[B, T, G, K]` slot-branch keys (G | H).
      v: `[B, T, G, V]`; s, g: `[B, T, G, M]` slot writes and log forget gates (≤ 0); they
        may be float32 with bf16 q, k, v (the slot math runs in float32 anyway).
      window: w ≥ 0 (0: gated slot attention only; ≥ T: causal softmax attention).
      scale: logit scale of both branches, default `K**-0.5`.
      q_window, k_window: `[B, T, H, D]`, `[B, T, G, D]` window-branch queries/keys (default
        q, k).
      empty_slots: "mask" or "sink" (module docstring).
      block_sizes: tiles (default per backend, `block_sizes.default_block_sizes`).
      backend: "gpu" or "tpu" kernels; default: the platform, or "gpu" when interpreting.
      interpret: run the kernels in Pallas interpret mode (CPU tests).

    Returns:
      o `[B, T, H, V]` in the dtype of q.
    """
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    reason = unsupported(q, k, v, s, g, window=window, q_window=q_window, k_window=k_window,
                         empty_slots=empty_slots, backend=backend, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas native_hybrid_attention: {reason}")
    backend = backend or _platform(interpret)
    blocks = block_sizes or default_block_sizes(backend, q.shape[-1])
    length = q.shape[1]
    window = min(int(window), length)
    # w a multiple of the chunk: the slot kernels read the undelayed inputs w/C chunks back
    # through their block indices; else the inputs are delayed here (one copy each).
    shift_chunks = window // blocks.chunk if window % blocks.chunk == 0 else 0
    st = Static(window=window, scale=float(q.shape[-1] ** -0.5 if scale is None else scale),
                slots=not (empty_slots == "mask" and window >= length),
                mask_empty=empty_slots == "mask", group=q.shape[2] // k.shape[2], blocks=blocks,
                interpret=interpret, shift_chunks=shift_chunks)
    stream = ()
    if st.slots:
        stream = (k, v, s, g) if shift_chunks else tuple(_delayed(x, window) for x in (k, v, s, g))
    padded = -(-length // blocks.time_multiple) * blocks.time_multiple
    args = [_pad_time(x, padded) for x in (q, q_window, k_window, v, *stream)]
    if _kernels(backend).LAYOUT.head_major:
        args = [_swap_time_heads(x) for x in args]
        return _swap_time_heads(_core(st, backend, *args))[:, :length].astype(q.dtype)
    return _core(st, backend, *args)[:, :length].astype(q.dtype)


def unsupported(q, k, v, s, g, *, window, q_window=None, k_window=None, empty_slots="mask",
                backend=None, interpret=False) -> str | None:
    """None when the kernels can run this call, else the reason (for `implementation=` auto
    dispatch: a non-None reason means "use the XLA form", never a warning)."""
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    arrays = dict(q=q, k=k, v=v, s=s, g=g, q_window=q_window, k_window=k_window)
    if any(x.ndim != 4 for x in arrays.values()):
        return "every input must be [batch, time, heads, dim]"
    batch, length, heads, key_dim = q.shape
    kv_heads = k.shape[2]
    expected = dict(k=(batch, length, kv_heads, key_dim), v=(batch, length, kv_heads, v.shape[3]),
                    s=(batch, length, kv_heads, s.shape[3]), g=s.shape,
                    q_window=(batch, length, heads, q_window.shape[3]),
                    k_window=(batch, length, kv_heads, q_window.shape[3]))
    for name, shape in expected.items():
        if arrays[name].shape != tuple(shape):
            return f"{name} has shape {arrays[name].shape}, expected {tuple(shape)}"
    if heads % kv_heads:
        return f"kv heads ({kv_heads}) must divide heads ({heads})"
    if not isinstance(window, int | np.integer) or window < 0:
        return f"window must be an int >= 0, got {window!r}"
    if empty_slots not in EMPTY_SLOTS:
        return f"empty_slots={empty_slots!r} is not one of {list(EMPTY_SLOTS)}"
    if len({x.dtype for name, x in arrays.items() if name not in ("s", "g")}) != 1:
        return "q, k, v, q_window and k_window must share one dtype"
    if not all(jnp.issubdtype(x.dtype, jnp.floating) for x in arrays.values()):
        return "inputs must be floating point"
    platform = backend or _platform(interpret)
    if platform not in ("gpu", "tpu"):
        return f"no Pallas NHA kernel for platform {platform!r} (use interpret=True on CPU)"
    if interpret:
        return None
    if jax.default_backend() != platform:
        return f"backend {platform!r} requested but the default device is {jax.default_backend()}"
    if q.dtype not in _ACCELERATOR_DTYPES:
        return f"dtype {q.dtype} (the kernels take bfloat16 or float16; s and g may be float32)"
    if any(x.dtype == jnp.float64 for x in (s, g)):
        return "float64 s or g"
    dims = dict(K=key_dim, V=v.shape[3], D=q_window.shape[3])
    for name, dim in dims.items():
        if dim not in _ACCELERATOR_DIMS:
            return f"head dim {name}={dim} (the kernels take {_ACCELERATOR_DIMS})"
    if s.shape[3] not in (16, 32, 64, 128):
        return f"num_slots={s.shape[3]} (the kernels take 16, 32, 64 or 128)"
    return None


def is_supported(*args, **kwargs) -> bool:
    return unsupported(*args, **kwargs) is None


def _platform(interpret: bool) -> str:
    platform = jax.default_backend()
    if interpret and platform == "cpu":
        return "gpu"
    return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def _delayed(x: jax.Array, window: int) -> jax.Array:
    """`x'_t = x_{t−w}` (zeros entering): the slot inputs entering at each step."""
    return jnp.pad(x, [(0, 0), (window, 0), (0, 0), (0, 0)])[:, : x.shape[1]]


def _pad_time(x: jax.Array, length: int) -> jax.Array:
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)])


def _swap_time_heads(x: jax.Array) -> jax.Array:
    """`[B, T, H, d]` ↔ `[B, H, T, d]` (the TPU kernels' layout)."""
    return x.transpose(0, 2, 1, 3)


def _kernels(backend: str):
    """The backend's kernel module, imported on first use (the Triton lowering is not part of
    every jaxlib)."""
    if backend == "tpu":
        from pallas_kernels.nha import tpu

        return tpu
    from pallas_kernels.nha import gpu

    return gpu


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _core(st: Static, backend: str, q, qw, kw, v, *stream):
    return _core_forward(st, backend, q, qw, kw, v, *stream)[0]


def _core_forward(st: Static, backend: str, q, qw, kw, v, *stream):
    kernels = _kernels(backend)
    slot_inputs = logits = None
    if st.slots:
        ks, vs, ss, gs = stream
        gc, key_writes, value_writes, log_decay = kernels.chunk_prepare(ks, vs, ss, gs, st)
        key_states, value_states = kernels.chunk_scan((key_writes, value_writes), log_decay, st,
                                                      reverse=False)
        slot_inputs = (ks, vs, ss, gc, key_states, value_states)
        logits = kernels.slot_logits(q, ks, ss, gc, key_states, st)
    out, lse = kernels.window_attention(qw, kw, v, logits, st)
    if st.slots:
        out = kernels.slot_readout_add(out, logits, lse, vs, ss, gc, value_states, st)
    return out, (q, qw, kw, v, slot_inputs, logits, out, lse, stream)


def _core_backward(st: Static, backend: str, residuals, d_out):
    kernels = _kernels(backend)
    head_major = kernels.LAYOUT.head_major
    # Arrays below are [B, Tp, H, d], or [B, H, Tp, d] when head_major (TPU).
    time_major = (lambda x: _swap_time_heads(x)) if head_major else (lambda x: x)
    q, qw, kw, v, slot_inputs, logits, out, lse, stream = residuals
    delta = jnp.sum(out * d_out, axis=-1)  # out is float32
    delta = delta if head_major else delta.transpose(0, 2, 1)  # [B, H, Tp]
    d_out = d_out.astype(q.dtype)
    if st.window:
        dqw = kernels.window_backward_queries(qw, kw, v, d_out, lse, delta, st)
        dkw, dv = kernels.backward_window_keys(qw, kw, v, d_out, lse, delta, st)
    else:
        dqw, dkw, dv = jnp.zeros_like(qw), jnp.zeros_like(kw), jnp.zeros_like(v)
    if not st.slots:
        return jnp.zeros_like(q), dqw, dkw, dv
    dq, da, p, qg = kernels.slot_backward_queries(q, logits, lse, delta, d_out, slot_inputs, st)
    gc = slot_inputs[3]
    chunk = st.blocks.chunk
    log_decay = time_major(gc)[:, chunk - 1::chunk, :, None, :]  # [B, NC, G, 1, M]
    key_pull, value_pull = kernels.chunk_deltas_reverse(q, da, d_out, p, gc, st)
    k_end, vt_end = kernels.chunk_scan((key_pull, value_pull), log_decay, st, reverse=True)
    dks, dvs, dss, dg_chunk = kernels.backward_slot_inputs(q, d_out, (da, p, qg), slot_inputs,
                                                           k_end, vt_end, st)
    dgs = time_major(_add_later_chunks(time_major(dg_chunk), chunk, st.shift_chunks))
    dgs = dgs.astype(stream[3].dtype)
    return dq, dqw, dkw, dv, dks, dvs, dss, dgs


def _add_later_chunks(dg_chunk: jax.Array, chunk: int, shift: int) -> jax.Array:
    """Within-chunk reverse cumulative sums `[B, Tp, G, M]` → over the whole stream: each
    chunk adds the totals of the stream chunks after it (a chunk's total is its first row).
    With `shift` D, stream chunk c is stored at token chunk (c − D) mod NC and the D empty
    leading stream chunks (tokens that never enter the slots) stay 0."""
    batch, length, heads, slots = dg_chunk.shape
    totals = jnp.roll(dg_chunk[:, ::chunk], shift, axis=1)  # [B, NC, G, M], stream order
    later = jnp.flip(jnp.cumsum(jnp.flip(totals, 1), axis=1), 1) - totals
    later = jnp.roll(later.at[:, :shift].set(0.0), -shift, axis=1)
    by_chunk = dg_chunk.reshape(batch, length // chunk, chunk, heads, slots) + later[:, :, None]
    return by_chunk.reshape(dg_chunk.shape)


_core.defvjp(_core_forward, _core_backward)
