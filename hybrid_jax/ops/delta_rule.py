"""Gated delta rule (Gated DeltaNet, Yang et al. 2024): a linear RNN with a K×V state per head.

Per step t, with state `S` `[K, V]` per head (zeros unless `initial_state` is given):

    S ← exp(g_t)·S                      g_t ≤ 0 is the log decay
    u_t = β_t·(v_t − Sᵀ k_t)            delta-rule correction towards v_t
    S ← S + k_t u_tᵀ
    o_t = Sᵀ (scale·q_t)

Layout `[batch, time, heads, dim]`. The op does not normalise q and k (the modules L2-normalise
them). Recurrent math runs in float32 (float64 stays float64); outputs have the dtype of `q`,
the final state is float32 (float64 for float64 inputs).

Rungs: "pallas" (the kernels of `pallas_kernels.delta_rule`: GPU or TPU, bfloat16/float32 q, k,
v, head dims 64/128/256; auto picks it on a GPU wherever it can run the call, else logs why and
runs "xla"; on a TPU it runs only when named, its kernels not yet measured there),
"reference" (per-token `lax.scan`, the definition) and "xla" (chunked). The chunked form
first solves the unit-lower-triangular C×C system `(I + A)` of every chunk at once
(`unit_lower_triangular_inverse`: batched forward substitution and matmuls, float32/float64;
jaxlib's CPU `solve_triangular` deadlocks when two solves run at once on a small thread pool)
into the WY terms `W`, `U₀` (`_wy_terms`, state-independent), then runs a `lax.scan` over chunks
of C steps: each step takes the state entering the chunk, forms its corrections `U = U₀ − W S₀`,
and returns the chunk's outputs and the state after it (`_chunk_step`, under `jax.checkpoint`,
so the backward pass keeps only the entering states, one K×V per chunk). Memory O(T·(K + V + C))
plus the chunk states, never a state per token. `gated_delta_rule_step` advances one token
(decoding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_dims, check_floating
from hybrid_jax.ops.dispatch import Rung, backend, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.partition import shard_kernel
from hybrid_jax.ops.scan import (
    causal_decay_matrix,
    compute_dtype,
    from_time_chunks,
    time_chunks,
    unit_lower_triangular_inverse,
    varying_scan,
)
from hybrid_jax.ops.segments import document_starts, reset_log_decay, reset_state
from pallas_kernels.delta_rule import api as pallas_delta_rule

_OP = "gated_delta_rule"


@typed_like_inputs
def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: jax.Array | None = None,
    return_final_state: bool = False,
    segment_ids: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The gated delta rule over a sequence (see the module docstring for the recurrence).

    Args:
      q: `[B, T, H, K]` queries.
      k: `[B, T, H, K]` keys (normally L2-normalised by the caller).
      v: `[B, T, H, V]` values.
      g: `[B, T, H]` log decays (≤ 0).
      beta: `[B, T, H]` write strengths (normally in (0, 1)).
      scale: query scale, default `K**-0.5`.
      chunk_size: chunk length of the "xla" rung (any T: time is zero-padded internally; the
        "pallas" rung uses its tuned chunk, `pallas_kernels.delta_rule.block_sizes`).
      initial_state: `[B, H, K, V]` state before the first step; None for zeros.
      return_final_state: also return the state after the last step.
      segment_ids: `[B, T]` packed-document ids; the state resets at each document start
        (`hybrid_jax.ops.segments`).
      implementation: "pallas", "xla", "reference" or None (auto: pallas, then xla).

    Returns:
      `o` `[B, T, H, V]` in the dtype of `q`, or `(o, final_state)` with `final_state`
      `[B, H, K, V]` in float32 (float64 for float64 inputs).
    """
    _check(q, k, v, g, beta, initial_state, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    starts = document_starts(_OP, segment_ids, q.shape[0], q.shape[1])
    out, final_state = dispatch(
        _OP, _RUNGS, implementation, q, k, v, g, beta,
        scale=scale, chunk_size=chunk_size, initial_state=initial_state, starts=starts,
    )
    return (out, final_state) if return_final_state else out


@typed_like_inputs
def gated_delta_rule_step(
    state: jax.Array,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One token of the gated delta rule (decoding).

    Args:
      state: `[B, H, K, V]` state before this token.
      q, k: `[B, H, K]`; v: `[B, H, V]`; g, beta: `[B, H]`.
      scale: query scale, default `K**-0.5`.

    Returns:
      `(o, new_state)`: `o` `[B, H, V]` in the dtype of `q`, `new_state` `[B, H, K, V]` in
      float32 (float64 for float64 inputs).
    """
    check_dims(f"{_OP}_step", {}, state=(state, "BHKV"), q=(q, "BHK"), k=(k, "BHK"),
               v=(v, "BHV"), g=(g, "BH"), beta=(beta, "BH"))
    check_floating(f"{_OP}_step", state=state, q=q, k=k, v=v, g=g, beta=beta)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(state, q, k, v, g, beta)
    new_state, out = _step(state.astype(dtype), *(x.astype(dtype) for x in (q, k, v, g, beta)),
                           scale=scale)
    return out.astype(q.dtype), new_state


def _check(q, k, v, g, beta, initial_state, chunk_size) -> None:
    sizes = check_dims(_OP, {}, q=(q, "BTHK"), k=(k, "BTHK"), v=(v, "BTHV"), g=(g, "BTH"),
                       beta=(beta, "BTH"))
    check_floating(_OP, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    if initial_state is not None:
        check_dims(_OP, sizes, initial_state=(initial_state, "BHKV"))
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{_OP}: chunk_size must be a positive int, got {chunk_size!r}")


def _step(state, q, k, v, g, beta, *, scale):
    """The recurrence for one token; every array in the compute dtype, heads before features."""
    state = jnp.exp(g)[..., None, None] * state
    u = beta[..., None] * (v - jnp.einsum("bhkv,bhk->bhv", state, k))
    state = state + k[..., :, None] * u[..., None, :]
    return state, jnp.einsum("bhkv,bhk->bhv", state, scale * q)


def _zero_state(q, v, dtype):
    batch, _, heads, key_dim = q.shape
    return jnp.zeros((batch, heads, key_dim, v.shape[-1]), dtype)


def gated_delta_rule_reference(q, k, v, g, beta, *, scale, chunk_size, initial_state, starts):
    """The definition: `_step` token by token with `lax.scan`, the state zeroed at document
    starts."""
    del chunk_size
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    state = _zero_state(q, v, dtype) if initial_state is None else initial_state.astype(dtype)
    starts = jnp.zeros(q.shape[:2], bool) if starts is None else starts
    time_major = [jnp.moveaxis(x.astype(dtype), 1, 0) for x in (q, k, v, g, beta)]
    final_state, out_TBHV = varying_scan(
        lambda s, xs: _step(reset_state(s, xs[0]), *xs[1:], scale=scale),
        state, [jnp.moveaxis(starts, 1, 0)] + time_major)
    return jnp.moveaxis(out_TBHV, 0, 1).astype(q.dtype), final_state


def gated_delta_rule_xla(q, k, v, g, beta, *, scale, chunk_size, initial_state, starts):
    """Chunked form (module docstring): the WY terms of every chunk at once, then a `lax.scan`
    of `_chunk_step` over chunks; document starts enter through the log decay g."""
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    state = _zero_state(q, v, dtype) if initial_state is None else initial_state.astype(dtype)
    g = reset_log_decay(g.astype(dtype), starts)
    chunks = [time_chunks(x, chunk_size) for x in
              [scale * q.astype(dtype)] + [x.astype(dtype) for x in (k, v, g, beta)]]
    q_c, k_c, v_c, g_c, beta_c = chunks  # [NC, B, H, C, ...]
    log_decay = jnp.cumsum(g_c, axis=-1)  # [NC, B, H, C]
    w, u0 = _wy_terms(k_c, v_c, beta_c, log_decay)
    xs = (q_c, k_c, log_decay, w, u0)
    final_state, out = varying_scan(_chunk_step, state, xs)
    return from_time_chunks(out, q.shape[1]).astype(q.dtype), final_state


def _wy_terms(k, v, beta, log_decay):
    """`W = T·(β e^Γ K)` and `U₀ = T·(βV)` of every chunk, `T = (I + A)⁻¹` (module docstring), so
    a chunk's corrections from its entering state S₀ are `U = U₀ − W S₀`. None of it depends on
    the state, so all chunks are solved at once (batched forward substitution, not one per step
    of the chunk scan): O(T·C) temporaries for the C×C systems of every chunk."""
    decay = causal_decay_matrix(log_decay)  # [..., C(t), C(j)], zero above the diagonal
    a = jnp.tril(beta[..., None] * jnp.einsum("...tk,...jk->...tj", k, k) * decay, -1)
    t = unit_lower_triangular_inverse(a)
    w = t @ ((beta * jnp.exp(log_decay))[..., None] * k)
    return w, t @ (beta[..., None] * v)


@jax.checkpoint
def _chunk_step(state, chunk):
    """Outputs of one chunk and the state after it, from the entering state S₀ `[B, H, K, V]`.

    q (scaled), k `[B, H, C, K]`, Γ `[B, H, C]` the cumulative log decay from the chunk start,
    and the chunk's WY terms W `[B, H, C, K]`, U₀ `[B, H, C, V]`. The corrections satisfy
    `u_t = β_t(v_t − e^{Γ_t} S₀ᵀk_t − Σ_{j<t} e^{Γ_t−Γ_j}(k_t·k_j) u_j)`, i.e. the
    unit-lower-triangular system `(I + A) U = β(V − e^Γ K S₀)`, A strictly lower triangular, so
    `U = U₀ − W S₀`; then `o_t = e^{Γ_t} S₀ᵀq_t + Σ_{j≤t} e^{Γ_t−Γ_j}(q_t·k_j) u_j` and
    `S = e^{Γ_C} S₀ + Σ_j e^{Γ_C−Γ_j} k_j u_jᵀ`. Every exponent is Γ_t − Γ_j with j ≤ t (masked
    before exp), so strongly negative g cannot overflow.
    """
    q, k, log_decay, w, u0 = chunk
    decay = causal_decay_matrix(log_decay)
    u = u0 - w @ state
    out = (jnp.einsum("bhck,bhkv->bhcv", q * jnp.exp(log_decay)[..., None], state)
           + jnp.einsum("bhtj,bhjv->bhtv", jnp.einsum("bhtk,bhjk->bhtj", q, k) * decay, u))
    k_to_end = k * jnp.exp(log_decay[..., -1:] - log_decay)[..., None]
    state = (jnp.exp(log_decay[..., -1])[..., None, None] * state
             + jnp.einsum("bhck,bhcv->bhkv", k_to_end, u))
    return state, out


def _pallas_unsupported(q, k, v, g, beta, *, scale, chunk_size, initial_state, starts
                        ) -> str | None:
    if backend() not in ("gpu", "tpu"):
        return f"needs a GPU or TPU backend, running on {backend()}"
    return pallas_delta_rule.unsupported(q, k, v, g, beta, initial_state, starts,
                                         backend=backend())


def gated_delta_rule_pallas(q, k, v, g, beta, *, scale, chunk_size, initial_state, starts):
    """The Pallas kernels (`pallas_kernels.delta_rule`) on each device's batch and heads; their
    own chunk, not `chunk_size`. A zero initial state is passed in (not made by the kernels'
    entry point), so that under a mesh it is split like the other inputs."""
    del chunk_size
    platform = backend()
    if initial_state is None:
        initial_state = _zero_state(q, v, jnp.float32)

    def kernel(q, k, v, g, beta, initial_state, starts):
        return pallas_delta_rule.gated_delta_rule(q, k, v, g, beta, scale=scale,
                                                  initial_state=initial_state, starts=starts,
                                                  backend=platform)

    return shard_kernel(_OP, kernel, (q, k, v, g, beta, initial_state, starts),
                        ("BTHK", "BTHK", "BTHV", "BTH", "BTH", "BHKV", "BT"), ("BTHV", "BHKV"))


_RUNGS = (
    # Chosen automatically on GPUs only: the TPU kernels have run in TPU interpret mode, never
    # on a TPU (pallas_kernels/delta_rule/NOTES.md, "TPU kernels"); `implementation="pallas"`
    # runs them.
    Rung("pallas", gated_delta_rule_pallas, _pallas_unsupported, auto_platforms=("gpu",)),
    Rung("xla", gated_delta_rule_xla),
    Rung("reference", gated_delta_rule_reference, auto=False),
)
