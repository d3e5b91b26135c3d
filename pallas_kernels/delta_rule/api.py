"""The gated delta rule with Pallas kernels: entry point, support checks, custom VJP.

Per step t and head, state S `[K, V]` (the initial state, or zeros):

    S ← e^{g_t} S;   u_t = β_t (v_t − Sᵀ k_t);   S ← S + k_t u_tᵀ;   o_t = Sᵀ (scale·q_t)

and the state is zero before each document's first token (`starts`). This is the contract of
`hybrid_jax.ops.gated_delta_rule` (its "pallas" rung). Time is cut into chunks of C steps and
padded to a multiple of C (padded steps have β = 0, g = 0: they leave the state alone).
Forward: `forward.chunk_prepare` (parallel over chunks) and `forward.chunk_states_and_outputs`
(one sequential pass over chunks per batch, head and V tile), or with
`BlockSizes.split_outputs` `forward.chunk_states` (the pass carrying only the state) and
`forward.chunk_outputs` (parallel over chunks); backward:
`backward.chunk_state_gradients` (the reverse pass) and `gradients.chunk_gradients` (parallel).
These are the GPU kernels (Triton lowering); `backend="tpu"` runs `tpu.py`'s two Mosaic TPU
kernels (forward and backward, each one sequential pass over chunks) on the same arrays.
Values wider than `VALUE_SLICE` (e.g. V = 512, gdn-340m's expanded values) run as column
slices, folded into the heads of one call whose GPU kernels read each slice's q, k, g, β and
the K-side terms W, P, T from one copy (`Static.key_group`). Memory is linear in T. NOTES.md
has the design, the roofline and the measurements.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import target
from pallas_kernels.delta_rule import tpu
from pallas_kernels.delta_rule.backward import chunk_state_gradients
from pallas_kernels.delta_rule.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.delta_rule.forward import (
    chunk_outputs,
    chunk_prepare,
    chunk_states,
    chunk_states_and_outputs,
)
from pallas_kernels.delta_rule.gradients import chunk_gradients
from pallas_kernels.delta_rule.static import Static
from pallas_kernels.residuals import saved
from pallas_kernels.vma import varying_like

HEAD_DIMS = (64, 128, 256)
# Wider values run as slices of this many columns: each column of S evolves on its own (on a
# GPU the slices of a head share q, k, g, β and the K-side terms W, T, P through the kernels'
# index maps; on a TPU those are repeated and recomputed per slice; gradients add up).
# The slices run as extra heads of one call, so each kernel is one launch with every slice's
# programs (measured as fast as a launch per slice at gdn-340m's shape: NOTES.md, Round 7).
VALUE_SLICE = 256
DTYPES = (jnp.bfloat16, jnp.float32)
F32 = jnp.float32


def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    starts: jax.Array | None = None,
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule over a sequence (module docstring); differentiable in every array.

    Args:
      q, k: `[B, T, H, K]`; v: `[B, T, H, V]` (one dtype: bfloat16 or float32).
      g: `[B, T, H]` log decays (≤ 0); beta: `[B, T, H]` write strengths (any float dtype).
      scale: query scale, default `K**-0.5`.
      initial_state: `[B, H, K, V]` state before the first step, or None (zeros).
      starts: `[B, T]` bool, True where a document starts (after the first token: the first
        token continues `initial_state`), or None.
      block_sizes: tiles and launch parameters of every kernel (default on the GPU
        `default_block_sizes(K, V, sequences=B·H)`, H counting each V slice as a head, with
        `training=False` for a forward that is not differentiated; on a TPU
        `tpu.DEFAULT_BLOCKS`, whose kernels read only its chunk).
      backend: "gpu" or "tpu" kernels; default: the platform, or "gpu" when interpreting on
        the CPU.
      interpret: run the kernels in Pallas interpret mode (CPU tests; the TPU kernels in TPU
        interpret mode).

    Returns:
      `(o, final_state)`: o `[B, T, H, V]` in q's dtype, final state `[B, H, K, V]` float32.
    """
    reason = unsupported(q, k, v, g, beta, initial_state, starts, block_sizes=block_sizes,
                         backend=backend, interpret=interpret)
    if reason is not None:
        raise ValueError(f"pallas gated_delta_rule: {reason}")
    backend = backend or _default_backend(interpret)
    options = dict(scale=scale, starts=starts, block_sizes=block_sizes, backend=backend,
                   interpret=interpret)
    if v.shape[-1] > VALUE_SLICE:
        return _as_slices(q, k, v, g, beta, initial_state=initial_state, **options)
    return _run(q, k, v, g, beta, initial_state=initial_state, key_group=1, **options)


def _run(q, k, v, g, beta, *, scale, initial_state, starts, block_sizes, backend, interpret,
         key_group: int):
    """`gated_delta_rule` on checked inputs, V ≤ `VALUE_SLICE`; v and the state have
    `key_group` heads for each head of q, k, g and β (head h reads key head h // key_group)."""
    batch, length, heads, value_dim = v.shape
    key_dim = q.shape[-1]
    if block_sizes is None and backend == "tpu":
        block_sizes = tpu.DEFAULT_BLOCKS
    defaults = functools.partial(default_block_sizes, key_dim, value_dim,
                                 itemsize=jnp.dtype(q.dtype).itemsize, sequences=batch * heads)
    blocks = _fitted(block_sizes or defaults(), key_dim, value_dim)
    st = Static(scale=float(key_dim ** -0.5 if scale is None else scale), blocks=blocks,
                documents=starts is not None, interpret=interpret, key_group=key_group)
    st_forward = dataclasses.replace(st, blocks=_fitted(block_sizes or defaults(training=False),
                                                        key_dim, value_dim))
    padded = -(-length // blocks.chunk) * blocks.chunk
    pad = lambda x: jnp.pad(x, [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2))
    g = g.astype(F32)
    if starts is not None:
        g = jnp.where(starts[..., None], 0.0, g)  # a start's own decay multiplies a zero state
    heads_first = lambda x: pad(x.astype(F32)).transpose(0, 2, 1)  # [B, T, H] → [B, H, Tp]
    state = (jnp.zeros((batch, heads, key_dim, value_dim), F32) if initial_state is None
             else initial_state.astype(F32))
    state = varying_like(state, q, k, v, g, beta)  # a zero or replicated state, per-device rows
    args = (pad(q), pad(k), pad(v), heads_first(g), heads_first(beta),
            None if starts is None else pad(starts.astype(F32)), state)
    out, final_state = (_core(st, st_forward, *args) if backend == "gpu"
                        else tpu.gated_delta_rule(st, *args))
    return out[:, :length], final_state


def _as_slices(q, k, v, g, beta, *, initial_state, **options):
    """`gated_delta_rule` with V in slices of `VALUE_SLICE` columns, head h's slice s as head
    h·S + s of one call: on a GPU q, k, g, β and the K-side terms W, P, T made from them are
    shared by the slices through the kernels' index maps (`Static.key_group`; NOTES.md Rounds
    11 and 13), on a TPU q, k, g and β are repeated per slice; their gradients add up."""
    batch, length, heads, key_dim = q.shape
    slices = v.shape[-1] // VALUE_SLICE
    repeat = functools.partial(jnp.repeat, repeats=slices, axis=2)
    key_group = slices
    if options["backend"] == "tpu":
        q, k, g, beta, key_group = repeat(q), repeat(k), repeat(g), repeat(beta), 1
    v = v.reshape(batch, length, heads * slices, VALUE_SLICE)
    if initial_state is not None:  # [B, H, K, S·Vs] → [B, H·S, K, Vs]
        initial_state = initial_state.reshape(batch, heads, key_dim, slices, VALUE_SLICE)
        initial_state = initial_state.transpose(0, 1, 3, 2, 4).reshape(
            batch, heads * slices, key_dim, VALUE_SLICE)
    out, final_state = _run(q, k, v, g, beta, initial_state=initial_state,
                            key_group=key_group, **options)
    final_state = final_state.reshape(batch, heads, slices, key_dim, VALUE_SLICE)
    return (out.reshape(batch, length, heads, slices * VALUE_SLICE),
            final_state.transpose(0, 1, 3, 2, 4).reshape(batch, heads, key_dim, -1))


def unsupported(q, k, v, g, beta, initial_state=None, starts=None, *, block_sizes=None,
                backend=None, interpret=False) -> str | None:
    """None when the kernels can run this call, else the reason (for `implementation=`
    dispatch). `backend` as in `gated_delta_rule`. On the device: head dims in `HEAD_DIMS`
    (V also a multiple of `VALUE_SLICE`), on a TPU a chunk in `tpu.CHUNKS`; interpreted
    (either backend): any power-of-two dims."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return f"q, k, v must be [batch, time, heads, dim], got {q.shape}, {k.shape}, {v.shape}"
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    if 0 in q.shape + v.shape:
        return f"q, k, v must not be empty, got {q.shape}, {k.shape}, {v.shape}"
    expected = dict(k=(q.shape, k), v=((batch, length, heads, value_dim), v),
                    g=((batch, length, heads), g), beta=((batch, length, heads), beta))
    if initial_state is not None:
        expected["initial_state"] = ((batch, heads, key_dim, value_dim), initial_state)
    if starts is not None:
        expected["starts"] = ((batch, length), starts)
    for name, (shape, x) in expected.items():
        if tuple(x.shape) != tuple(shape):
            return f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}"
    if k.dtype != q.dtype or v.dtype != q.dtype or q.dtype not in DTYPES:
        return (f"q, k, v must share one dtype, bfloat16 or float32; got {q.dtype}, {k.dtype}, "
                f"{v.dtype}")
    others = dict(g=g, beta=beta, initial_state=initial_state)
    for name, x in others.items():
        if x is not None and (not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == jnp.float64):
            return f"{name} must be a floating dtype other than float64, got {x.dtype}"
    if block_sizes is not None and not isinstance(block_sizes, BlockSizes):
        return f"block_sizes must be a BlockSizes, got {type(block_sizes).__name__}"
    platform = backend or _default_backend(interpret)
    if platform not in ("gpu", "tpu"):
        return (f"needs a GPU or TPU (platform {platform!r}; interpret=True runs them on the "
                f"CPU)")
    if not interpret:
        if platform != _platform():
            return (f"the {platform.upper()} kernels were asked for, the platform is "
                    f"{_platform()!r}")
        kernels = f"the {platform.upper()} kernels"
        if key_dim not in HEAD_DIMS:
            return f"head dim K={key_dim} ({kernels} take {HEAD_DIMS})"
        if value_dim not in HEAD_DIMS and value_dim % VALUE_SLICE:
            return (f"head dim V={value_dim} ({kernels} take {HEAD_DIMS} or a multiple "
                    f"of {VALUE_SLICE})")
        chunk = (block_sizes or tpu.DEFAULT_BLOCKS).chunk
        if platform == "tpu" and chunk not in tpu.CHUNKS:
            return f"chunk {chunk} ({kernels} take {tpu.CHUNKS})"
    else:
        for name, dim in (("K", key_dim), ("V", value_dim)):
            if dim < 2 or dim & (dim - 1):
                return f"head dim {name}={dim} must be a power of two"
    return None


def _platform() -> str:
    return target.platform()


def _default_backend(interpret: bool) -> str:
    """The kernels of the platform; interpreting on the CPU, the GPU kernels."""
    platform = _platform()
    return "gpu" if interpret and platform == "cpu" else platform


def _fitted(blocks: BlockSizes, key_dim: int, value_dim: int) -> BlockSizes:
    """Tiles no wider than the head dims (powers of two, so they divide them)."""
    return dataclasses.replace(
        blocks, value_block=min(blocks.value_block, value_dim),
        gradient_key_block=min(blocks.gradient_key_block, key_dim),
        gradient_value_block=min(blocks.gradient_value_block, value_dim),
        forward_value_block=blocks.forward_value_block and min(blocks.forward_value_block,
                                                               value_dim),
        outputs_value_block=blocks.outputs_value_block and min(blocks.outputs_value_block,
                                                               value_dim))


def _forward(st: Static, q, k, v, g, beta, starts, initial_state, *, save: bool):
    """(o, final state), and when `save` (T, the states entering each chunk, U) besides W and
    P; with `split_outputs` the states and U are stored either way (the output kernel's)."""
    w, u0, p, *t = chunk_prepare(q, k, v, g, beta, starts, st, save=save)
    if st.blocks.split_outputs:
        final_state, states, u = chunk_states(k, w, u0, g, starts, initial_state, st)
        out = chunk_outputs(q, p, u, states, g, starts, st)
        saved = [states, u]
    else:
        out, final_state, *saved = chunk_states_and_outputs(q, k, w, u0, p, g, starts,
                                                            initial_state, st, save=save)
    return out, final_state, w, p, t, saved


# `st` holds the training kernels' blocks (forward with saved residuals, backward), `st_forward`
# those of a forward that is not differentiated; both have one chunk length.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _core(st: Static, st_forward: Static, q, k, v, g, beta, starts, initial_state):
    return _forward(st_forward, q, k, v, g, beta, starts, initial_state, save=False)[:2]


def _core_forward(st: Static, st_forward: Static, q, k, v, g, beta, starts, initial_state):
    out, final_state, w, p, (t,), (states, u) = _forward(st, q, k, v, g, beta, starts,
                                                         initial_state, save=True)
    out, final_state, w, p, t, states, u = saved(out, final_state, w, p, t, states, u)
    return (out, final_state), (q, k, v, g, beta, starts, w, p, t, states, u)


def _core_backward(st: Static, st_forward: Static, residuals, cotangents):
    q, k, v, g, beta, starts, w, p, t, states, u = residuals
    d_out, d_final = cotangents
    d_out = d_out.astype(q.dtype)
    du, d_states, d_initial = chunk_state_gradients(q, k, w, p, g, starts, d_out,
                                                    d_final.astype(F32), st)
    dq, dk, dv, d_beta, dg = chunk_gradients(q, k, v, g, beta, starts, t, states, d_states, u,
                                             du, d_out, st)
    if st.key_group > 1:  # the value heads of each key head add up
        dq, dk = (d.reshape(key.shape[:3] + (st.key_group, -1)).astype(F32).sum(3).astype(
            key.dtype) for d, key in ((dq, q), (dk, k)))
        d_beta, dg = (d.reshape(g.shape[:2] + (st.key_group, -1)).sum(2) for d in (d_beta, dg))
    return dq, dk, dv, dg, d_beta, None, d_initial


_core.defvjp(_core_forward, _core_backward)
