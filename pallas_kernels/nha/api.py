"""Native hybrid attention (NHA) with Pallas kernels: entry point, support checks, custom VJP.

Per step t and query head (kv head ⌊h·G/H⌋ for GQA), window w ≥ 0, M slots:

    slots   K̃, Ṽ: gated-slot recurrence over the tokens ≤ t − w
            (K̃_j = K̃_{j−1}·diag(e^{g_j}) + k_j s_jᵀ,  Ṽ_j = diag(e^{g_j})·Ṽ_{j−1} + s_j v_jᵀ)
    logits  [scale·K̃ᵀq_t ; scale·q̂_t·k̂_j for j in t−w+1..t], ONE softmax (float32)
    output  o_t = Ṽᵀ p_slots + Σ_j p_j v_j

Continuing a sequence (`initial_state`, a `State`): the slots start from the state's, and the
W = w tokens before the call (its ring, oldest first) come first: call position −W + i is ring
token i. The slot inputs then enter in the order [ring; call] (token i at step i), and the
windows reach back into the ring. Without a state nothing precedes the call (no token enters
before step w, and a window past T changes nothing).

Documents (`documents`, a `Documents` over the W + T tokens [ring; call], W = 0 without a
state): a query sees only window keys with its document id; a token flagged as a start empties
the slots before it enters them; the slots count for query t only while the newest token in
them (index t of [ring; call]) has t's id. Otherwise (no documents) every token is visible.
Where the slots hold nothing of t's document, they are left out of the softmax
(`empty_slots="mask"`) or count as M zero-value sinks with logit 0 (`"sink"`).

`hybrid_jax.ops.native_hybrid_attention` (the op; its NHAState, segment ids and dispatch) and
`hybrid_jax.ops.gated_slot_attention` (w = 0) call this; the op's XLA rung is the definition.

How: the slot inputs are delayed by w steps (token j enters at step j + w) and time is padded
to a multiple of the tiles. A per-chunk kernel computes each chunk's writes; a scan over chunks
turns them into the slot states at chunk boundaries (O(T/C·K·M) floats, never a state per token);
a per-chunk kernel turns them into the slot logits; the window kernel starts its online softmax
from those logits and visits only the key blocks that intersect each query block's windows; a
per-chunk kernel adds the slot values with the final softmax weights (at w = 0 it does the
softmax itself). The backward pass recomputes the window probabilities from the saved
log-sum-exp. Memory is linear in T. See NOTES.md for the measured times and the roofline.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import target
from pallas_kernels.flash_attention.bounds import document_extents, visible_span
from pallas_kernels.nha.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.nha.layout import Static
from pallas_kernels.nha.slot_kernels import SlotDocs
from pallas_kernels.residuals import saved
from pallas_kernels.vma import varying_like

EMPTY_SLOTS = ("mask", "sink")
# The GPU window kernels take document bounds from windows of this many tiles on: a packed
# row's full (or long) windows then cost its documents' triangles, not the row's, and the
# blocks inside one document skip the mask; below it the band is a few blocks, mostly masked
# anyway, and the bounds' sort would cost more than they save.
DOCUMENT_BOUNDS_BLOCKS = 4
# q, k, v dtypes per platform (Mosaic TPU has no float16 matmul; float32 runs on the MXU there).
_ACCELERATOR_DTYPES = dict(gpu=(jnp.bfloat16, jnp.float16), tpu=(jnp.bfloat16, jnp.float32))
_ACCELERATOR_DIMS = (64, 128, 256)
_ACCELERATOR_SLOTS = (16, 32, 64, 128)


class State(NamedTuple):
    """What precedes a call that continues a sequence (ring of W = window tokens, kv heads G).

    The slots hold the tokens before the ring; the ring's tokens enter them during the call.
    """

    slot_keys: jax.Array  # [B, G, K, M]
    slot_values: jax.Array  # [B, G, M, V]
    keys: jax.Array  # [B, W, G, K]  slot-branch keys of the W tokens before the call, oldest first
    values: jax.Array  # [B, W, G, V]
    s: jax.Array  # [B, W, G, M]
    g: jax.Array  # [B, W, G, M]
    window_keys: jax.Array  # [B, W, G, D]


class Documents(NamedTuple):
    """Packed documents over the tokens [ring; call] (`[B, W + T]`, W = 0 without a state)."""

    ids: jax.Array  # int: document of each token (an id no call token has: invisible)
    starts: jax.Array  # bool: the slots are emptied before this token enters them


def documents_from_segment_ids(segment_ids: jax.Array) -> Documents:
    """`Documents` of a call without a state from `[B, T]` segment ids (a token whose id differs
    from the previous token's starts a document)."""
    starts = jnp.concatenate([jnp.zeros_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    return Documents(segment_ids.astype(jnp.int32), starts)


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
    documents: Documents | None = None,
    initial_state: State | None = None,
    return_final_state: bool = False,
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
    interpret: bool = False,
):
    """NHA forward (differentiable in every float input, the state's included) with the Pallas
    kernels.

    Args:
      q: `[B, T, H, K]` slot-branch queries; k `[B, T, G, K]` slot-branch keys (G | H).
      v: `[B, T, G, V]`; s, g: `[B, T, G, M]` slot writes and log forget gates (≤ 0); they
        may be float32 with bf16 q, k, v (the slot math runs in float32 anyway).
      window: w ≥ 0 (0: gated slot attention only; ≥ T without a state: causal attention).
      scale: logit scale of both branches, default `K**-0.5`.
      q_window, k_window: `[B, T, H, D]`, `[B, T, G, D]` window-branch queries/keys (default
        q, k).
      empty_slots: "mask" or "sink" (module docstring).
      documents: `Documents` (module docstring), or None.
      initial_state: `State` to continue from (its ring holds `window` tokens), or None.
      return_final_state: also return the slots after the call's last step (the tokens
        ≤ T − 1 − w of [ring; call]); the ring of a final state is the caller's (the last W
        tokens).
      block_sizes: tiles (default per backend, `block_sizes.default_block_sizes`).
      backend: "gpu" or "tpu" kernels; default: the platform, or "gpu" when interpreting.
      interpret: run the kernels in Pallas interpret mode (CPU tests).

    Returns:
      o `[B, T, H, V]` in the dtype of q, or `(o, (K̃ [B, G, K, M], Ṽ [B, G, M, V]))` with the
      final slots in float32.
    """
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    reason = unsupported(q, k, v, s, g, window=window, q_window=q_window, k_window=k_window,
                         empty_slots=empty_slots, documents=documents,
                         initial_state=initial_state, backend=backend, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas native_hybrid_attention: {reason}")
    backend = backend or _platform(interpret)
    head_dim = max(q.shape[-1], v.shape[-1], q_window.shape[-1])
    blocks = block_sizes or default_block_sizes(backend, head_dim)
    length = q.shape[1]
    state = initial_state
    window = int(window) if state is not None else min(int(window), length)
    ring = window if state is not None else 0
    multiple = blocks.time_multiple
    padded = _round_up(length, multiple)
    offset = _round_up(ring, multiple)  # room for the ring before the call in the key arrays
    # w a multiple of the chunk and no ring: the slot kernels read the undelayed inputs w/C
    # chunks back through their block indices; else the inputs are delayed here (one copy each).
    shift_chunks = window // blocks.chunk if state is None and window % blocks.chunk == 0 else 0
    slots = state is not None or not (empty_slots == "mask" and window >= length)
    st = Static(window=window, scale=float(q.shape[-1] ** -0.5 if scale is None else scale),
                slots=slots, mask_empty=empty_slots == "mask", group=q.shape[2] // k.shape[2],
                blocks=blocks, interpret=interpret, shift_chunks=shift_chunks, length=length,
                offset=offset, documents=documents is not None or state is not None,
                document_bounds=(backend == "gpu" and documents is not None
                                 and window >= DOCUMENT_BOUNDS_BLOCKS * multiple))
    pad = lambda x: _pad_time(x, padded)
    if state is None:
        kw, vw = pad(k_window), pad(v)
    else:
        kw, vw = (jnp.concatenate([_front(r.astype(x.dtype), offset), pad(x)], axis=1)
                  for r, x in ((state.window_keys, k_window), (state.values, v)))
    stream = initial = None
    if slots:
        ring_inputs = None if state is None else (state.keys, state.values, state.s, state.g)
        stream = tuple(pad(_stream(x, window, shift_chunks, None if ring_inputs is None
                                   else ring_inputs[i].astype(x.dtype)))
                       for i, x in enumerate((k, v, s, g)))
    if state is not None:
        initial = (state.slot_keys.astype(jnp.float32),
                   jnp.swapaxes(state.slot_values, 2, 3).astype(jnp.float32))
    elif not slots:  # the slots stay empty: these are the final ones
        batch, kv_heads, num_slots = k.shape[0], k.shape[2], s.shape[3]
        initial = (jnp.zeros((batch, kv_heads, k.shape[3], num_slots), jnp.float32),
                   jnp.zeros((batch, kv_heads, v.shape[3], num_slots), jnp.float32))
    # A zero or replicated state, per-device rows.
    initial = None if initial is None else varying_like(initial, q, k, v, s, g)
    docs = _slot_docs(documents, st, q.shape[0], ring, padded) if st.documents else None
    args = [pad(q), pad(q_window), kw, vw]
    head_major = _kernels(backend).LAYOUT.head_major
    if head_major:
        args = [_swap_time_heads(x) for x in args]
        stream = stream and tuple(_swap_time_heads(x) for x in stream)
    out, final_keys, final_values_t = _core(st, backend, *args, stream, initial, docs)
    out = (_swap_time_heads(out) if head_major else out)[:, :length].astype(q.dtype)
    if not return_final_state:
        return out
    return out, (final_keys, jnp.swapaxes(final_values_t, 2, 3))


def unsupported(q, k, v, s, g, *, window, q_window=None, k_window=None, empty_slots="mask",
                documents=None, initial_state=None, backend=None, interpret=False) -> str | None:
    """None when the kernels can run this call, else the reason (for `implementation=` auto
    dispatch in the ops)."""
    q_window = q if q_window is None else q_window
    k_window = k if k_window is None else k_window
    arrays = dict(q=q, k=k, v=v, s=s, g=g, q_window=q_window, k_window=k_window)
    if any(x.ndim != 4 for x in arrays.values()):
        return "every input must be [batch, time, heads, dim]"
    batch, length, heads, key_dim = q.shape
    kv_heads, value_dim, slots, window_dim = k.shape[2], v.shape[3], s.shape[3], q_window.shape[3]
    expected = dict(k=(batch, length, kv_heads, key_dim), v=(batch, length, kv_heads, value_dim),
                    s=(batch, length, kv_heads, slots), g=s.shape,
                    q_window=(batch, length, heads, window_dim),
                    k_window=(batch, length, kv_heads, window_dim))
    for name, shape in expected.items():
        if arrays[name].shape != tuple(shape):
            return f"{name} has shape {arrays[name].shape}, expected {tuple(shape)}"
    if any(x.size == 0 for x in (q, k, v, s, g)):
        return f"no input may be empty, got q {q.shape}, k {k.shape}, v {v.shape}, s {s.shape}"
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
    ring = 0
    if initial_state is not None:
        ring = window
        reason = _state_unsupported(initial_state, dict(
            slot_keys=(batch, kv_heads, key_dim, slots),
            slot_values=(batch, kv_heads, slots, value_dim), keys=(batch, ring, kv_heads, key_dim),
            values=(batch, ring, kv_heads, value_dim), s=(batch, ring, kv_heads, slots),
            g=(batch, ring, kv_heads, slots), window_keys=(batch, ring, kv_heads, window_dim)))
        if reason is not None:
            return reason
    if documents is not None:
        if not isinstance(documents, Documents):
            return f"documents must be a Documents, got {type(documents).__name__}"
        for name, x in documents._asdict().items():
            if x.shape != (batch, ring + length):
                return f"documents.{name} has shape {x.shape}, expected {(batch, ring + length)}"
        if not jnp.issubdtype(documents.ids.dtype, jnp.integer):
            return f"documents.ids must be integers, got {documents.ids.dtype}"
        if documents.starts.dtype != jnp.bool_:
            return f"documents.starts must be bool, got {documents.starts.dtype}"
    platform = backend or _platform(interpret)
    if platform not in ("gpu", "tpu"):
        return f"no Pallas NHA kernel for platform {platform!r} (use interpret=True on CPU)"
    if interpret:
        return None
    if target.platform() != platform:
        return f"backend {platform!r} requested but the target platform is {target.platform()}"
    dtypes = _ACCELERATOR_DTYPES[platform]
    if q.dtype not in dtypes:
        names = " or ".join(jnp.dtype(d).name for d in dtypes)
        return (f"dtype {q.dtype} (the {platform.upper()} kernels take {names}; s and g may be "
                "float32)")
    if any(x.dtype == jnp.float64 for x in (s, g)):
        return "float64 s or g"
    for name, dim in dict(K=key_dim, V=value_dim, D=window_dim).items():
        if dim not in _ACCELERATOR_DIMS:
            return f"head dim {name}={dim} (the kernels take {_ACCELERATOR_DIMS})"
    if slots not in _ACCELERATOR_SLOTS:
        return f"num_slots={slots} (the kernels take {_ACCELERATOR_SLOTS})"
    return None


def is_supported(*args, **kwargs) -> bool:
    return unsupported(*args, **kwargs) is None


def _state_unsupported(state, shapes: dict[str, tuple]) -> str | None:
    if not isinstance(state, State):
        return f"initial_state must be a State, got {type(state).__name__}"
    for name, shape in shapes.items():
        x = getattr(state, name)
        if x.shape != shape:
            return f"initial_state.{name} has shape {x.shape}, expected {shape}"
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return f"initial_state.{name} must be floating point, got {x.dtype}"
    return None


def _platform(interpret: bool) -> str:
    platform = target.platform()
    return "gpu" if interpret and platform == "cpu" else platform


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_time(x: jax.Array, length: int, value=0) -> jax.Array:
    widths = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths, constant_values=value)


def _front(x: jax.Array, length: int) -> jax.Array:
    """x `[B, W, ...]` right-aligned in `length` ≥ W positions (zeros before it)."""
    widths = [(0, 0), (length - x.shape[1], 0)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths)


def _stream(x: jax.Array, window: int, shift_chunks: int, ring: jax.Array | None):
    """The slot inputs entering at each step (in the kernels' storage order), `[B, T, ...]`:
    with a ring, [ring; call] from its start; with the shift, x as it is (read w/C chunks
    back); else x delayed by w steps (`x'_t = x_{t−w}`, zeros entering)."""
    length = x.shape[1]
    if ring is not None:
        return jnp.concatenate([ring, x], axis=1)[:, :length]
    if shift_chunks:
        return x
    return _front(x, length + window)[:, :length]


def _slot_docs(documents: Documents | None, st: Static, batch: int, ring: int,
               padded: int) -> SlotDocs:
    """The kernels' per-token arrays (`SlotDocs`) from `Documents` (None: every token visible,
    no document starts)."""
    length = st.length
    if documents is None:
        shape = (batch, ring + length)
        documents = Documents(jnp.zeros(shape, jnp.int32), jnp.zeros(shape, bool))
    ids, starts = documents.ids.astype(jnp.int32), documents.starts
    query_ids = ids[:, ring:]
    # The newest token in the slots at step t is index t of [ring; call] (t − w of the call
    # without a ring); padded rows count as holding (so that no row's softmax is empty).
    if ring:
        holds = ids[:, :length] == query_ids
    else:
        behind = _front(query_ids, length + st.window)[:, :length]
        holds = (jnp.arange(length) >= st.window) & (behind == query_ids)
    holds = _pad_time(holds, padded, True)
    # Window ids over the key positions (offset before the call): the padding before the ring
    # is in no window; a padded query row sees itself.
    window_ids = _pad_time(_front(ids, st.offset + length), st.offset + padded)
    stream_starts = _pad_time(_stream(starts[:, ring:], st.window, st.shift_chunks,
                                      starts[:, :ring] if ring else None), padded)
    # Only the inputs entering at steps < T count (with the shift, the tokens ≥ T − w sit in
    # the last stream chunk but never enter).
    stream_starts &= jnp.arange(padded) < length - st.shift_chunks * st.blocks.chunk
    by_chunk = stream_starts.reshape(stream_starts.shape[0], -1, st.blocks.chunk)
    sigma = jnp.cumsum(by_chunk, axis=2, dtype=jnp.int32).reshape(stream_starts.shape)
    as_int = lambda x: x.astype(jnp.int32)
    window_ids = as_int(window_ids)
    spans = (None,) * 4
    if st.document_bounds:  # one sort of the ids: exact extents for any id pattern
        spans = visible_span(document_extents(window_ids), st.window)
    return SlotDocs(window_ids, as_int(holds), sigma, as_int(stream_starts), *spans)


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
def _core(st: Static, backend: str, q, qw, kw, v, stream, initial, docs):
    return _core_forward(st, backend, q, qw, kw, v, stream, initial, docs)[0]


def _core_forward(st: Static, backend: str, q, qw, kw, v, stream, initial, docs):
    """Returns ((o float32, final K̃ [B, G, K, M], final Ṽᵀ [B, G, V, M]), residuals)."""
    kernels = _kernels(backend)
    slot_inputs = logits = log_decay = None
    finals = initial
    if st.slots:
        ks, vs, ss, gs = stream
        gc, key_writes, value_writes, log_decay = kernels.chunk_prepare(ks, vs, ss, gs, docs, st)
        (key_states, value_states), finals = kernels.chunk_scan(
            (key_writes, value_writes), log_decay, st, reverse=False, initial=initial)
        gc, key_states, value_states, log_decay = saved(gc, key_states, value_states, log_decay)
        slot_inputs = (ks, vs, ss, gc, key_states, value_states)
        logits = kernels.slot_logits(q, ks, ss, gc, key_states, docs, st)
    if st.slots and not st.window:  # no window: the softmax is over the slots alone
        out, lse = kernels.slot_readout(logits, vs, ss, gc, value_states, docs, st)
    else:
        out, lse = kernels.window_attention(qw, kw, v, logits, docs, st)
        if st.slots:
            out = kernels.slot_readout_add(out, logits, lse, vs, ss, gc, value_states, docs, st)
    out, lse, logits, finals = saved(out, lse, logits, finals)
    return (out, *finals), (q, qw, kw, v, slot_inputs, logits, log_decay, out, lse, stream,
                            initial, docs, finals)


def _core_backward(st: Static, backend: str, residuals, cotangents):
    kernels = _kernels(backend)
    head_major = kernels.LAYOUT.head_major
    # Arrays below are [B, Tp, H, d], or [B, H, Tp, d] when head_major (TPU).
    time_major = (lambda x: _swap_time_heads(x)) if head_major else (lambda x: x)
    (q, qw, kw, v, slot_inputs, logits, log_decay, out, lse, stream, initial, docs,
     finals) = residuals
    d_out, d_final_keys, d_final_values_t = cotangents
    delta = jnp.sum(out * d_out, axis=-1)  # out is float32
    delta = kernels.LAYOUT.row_vectors(delta if head_major else delta.transpose(0, 2, 1))
    d_out = d_out.astype(q.dtype)
    if st.window:
        dqw = kernels.window_backward_queries(qw, kw, v, d_out, lse, delta, docs, st)
        dkw, dv = kernels.backward_window_keys(qw, kw, v, d_out, lse, delta, docs, st)
    else:
        dqw, dkw, dv = jnp.zeros_like(qw), jnp.zeros_like(kw), jnp.zeros_like(v)
    if not st.slots:
        return jnp.zeros_like(q), dqw, dkw, dv, None, None, None
    dq, da, p, qg = kernels.slot_backward_queries(q, logits, lse, delta, d_out, slot_inputs,
                                                  docs, st)
    gc = slot_inputs[3]
    key_pull, value_pull = kernels.chunk_deltas_reverse(q, da, d_out, p, gc, docs, st)
    (k_end, vt_end), d_initial = kernels.chunk_scan(
        (key_pull, value_pull), log_decay, st, reverse=True,
        initial=(d_final_keys, d_final_values_t))
    dks, dvs, dss, dg_chunk = kernels.backward_slot_inputs(q, d_out, (da, p, qg), slot_inputs,
                                                           k_end, vt_end, docs, st)
    # The final slots scale with e^{G} of the last step in every slot: that step's gate
    # gradient gains Σ (dK̃ ⊙ K̃) + Σ (dṼᵀ ⊙ Ṽᵀ), which every earlier step's gate shares.
    final_term = (jnp.sum(d_final_keys * finals[0], axis=2)
                  + jnp.sum(d_final_values_t * finals[1], axis=2))  # [B, G, M]
    starts = None if docs is None else docs.starts
    dgs = time_major(_gate_gradient(time_major(dg_chunk), final_term, starts, st))
    dgs = dgs.astype(stream[3].dtype)
    return (dq, dqw, dkw, dv, (dks, dvs, dss, dgs), None if initial is None else d_initial,
            None)


def _gate_gradient(dg_chunk: jax.Array, final_term: jax.Array, starts, st: Static):
    """The log-gate gradient `[B, Tp, G, M]` from the within-chunk reverse cumulative sums:
    each chunk adds the totals of the stream chunks after it (a chunk's total is its first
    row) and the final slots' term; rows that never enter the slots (with the shift: the
    tokens t ≥ T − w) and document starts (whose gates are left out) get 0. With `shift` D,
    stream chunk c is stored at token chunk (c − D) mod NC and the D empty leading stream
    chunks stay 0."""
    chunk, shift = st.blocks.chunk, st.shift_chunks
    batch, length, heads, slots = dg_chunk.shape
    totals = jnp.roll(dg_chunk[:, ::chunk], shift, axis=1)  # [B, NC, G, M], stream order
    later = jnp.flip(jnp.cumsum(jnp.flip(totals, 1), axis=1), 1) - totals
    later = jnp.roll(later.at[:, :shift].set(0.0), -shift, axis=1)
    by_chunk = dg_chunk.reshape(batch, length // chunk, chunk, heads, slots) + later[:, :, None]
    dg = by_chunk.reshape(dg_chunk.shape) + final_term[:, None]
    keep = jnp.arange(length) < st.length - shift * chunk  # [Tp]
    keep = keep[None, :] if starts is None else keep[None, :] & (starts == 0)
    return jnp.where(keep[:, :, None, None], dg, 0.0)


_core.defvjp(_core_forward, _core_backward)
