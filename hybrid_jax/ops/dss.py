"""Diagonal state space (DSS-exp, Gupta et al. 2022), the sequence mixer of GSS (Mehta et al.
2022).

Each of H channels is a linear time-invariant SSM `x'(t) = Λ x(t) + 1·u(t)`, `y = Re(W x)`,
with a complex diagonal `Λ` of N modes. Discretised with step `Δ = exp(log_dt)` (zero-order
hold, B = 1 folded into the output weights), per channel h and mode n:

    s_t = exp(λ_n Δ_h) · s_{t−1} + u_t                      (complex state, [B, H, N])
    y_t = Re(Σ_n c_{h,n} s_{t,n}),  c_{h,n} = w_{h,n} (exp(λ_n Δ_h) − 1) / λ_n

so y is the causal convolution of u with the DSS-exp kernel (Proposition 1(a) of DSS)
`K_k = Re(Σ_n c_{h,n} exp(λ_n Δ_h k))`. `λ = −exp(lambda_log_neg_re) + i·lambda_im` keeps the
real part negative, so the recurrence is stable. GSS's simplified DSS is the special case
`log_dt = 0` with Λ shared across channels (its pseudocode also exponentiates the imaginary
part, which callers can do before passing `lambda_im`). No D skip here: the module adds it.

`dss_discretize` maps the raw (real) parameters to `(log_decay = λΔ, coeff = c)`, both complex
`[H, N]`; `dss` runs the sequence form; `dss_step` one token. Rungs: "fft" (materialised
kernel + FFT convolution, as in GSS; no document resets), "xla" (chunked, below), "scan"
(`associative_scan` over every token's complex state; kept to measure against, not in auto)
and "reference" (per-token `lax.scan`). Math is complex64 (complex128 for float64 inputs); y
has u's dtype.

The chunked rung ("xla"), chunks of C tokens, `a = exp(λΔ)`, powers `a^k` for k ≤ C only (no
inverse powers, so nothing overflows), all of it real matmuls over the modes:

    intra   y_i += Σ_{j ≤ i, same document} K_{i−j} u_j        K_k = Re Σ_n c_n a_n^k (Toeplitz)
    state   S_c = [no start in c] · a^C · S_{c−1} + Σ_{j in c's last document} a^{C−1−j} u_j
    inter   y_i += [no start in c up to i] · Re Σ_n c_n a_n^{i+1} S_{c−1,n}

with the chunk states S_c `[B, T/C, H, N]` carried by `associative_scan` over chunks (from the
initial state); the last chunk's powers are shifted for the final state of an odd length. The
whole rung runs under `jax.checkpoint` (only its inputs are kept for the backward pass).

The intra term with documents. Documents are contiguous, so each token of a chunk has a rank
r = 0, 1, ... (its document counted from the chunk's first token's; `document_ranks`). When
every chunk of the call holds at most R = 3 documents (`fits_matmuls`, one scalar), the term is
`Σ_{r<R} P_r ⊙ (T · (P_r ⊙ u))` with `P_r = [rank == r]`: one batched matmul over the R masked
copies of u (`_document_matmuls`), and autodiff's gradients are matmuls too. Otherwise it is the
masked reduction `Σ_j T_ij [same document]_ij u_j` with its own VJP (`_masked_toeplitz`: forward
and each gradient are one reduction whose product has no other consumer, so no
`[B, X, C, C, H]` product is written). `lax.cond` picks one at run time, so the answer is exact
for any documents; under jit both compile and one runs (under vmap, both run and a select
keeps each row's; inside a context-parallel shard_map each shard picks its own).
Why R = 3: a chunk of C = 64 holds R + 1 documents only if R − 1 whole documents lie inside
it, and one such chunk anywhere in the batch sends the whole call to the reduction. With
R = 2, one document shorter than 63 tokens does; with R = 3 it takes two in one chunk. On the
benchmarks' packed data (log-normal lengths, `flash_attention.packed_segments`), 400 batches of
[4, 8192]: median 1024 → at most 2 documents per chunk in 396, 3 in 4; median 256 → 2 in 62,
3 in 336, 4 in 2 (R = 2 would fall back in 85 % of those steps, R = 3 in 0.5 %). R = 3 costs
1.5× R = 2's matmul work, ≈ 0.1 ms per layer at the shape below, so it pays once R = 2 falls
back in more than ~5–10 % of steps (a fallback costs ≈ 1 ms more).

Why chunked rather than "FFT per document with a correction", counted per token and layer at
pha-180m's sizes (H = 192 channels, N = 64 modes, C = 64, T = 8192), forward:
- chunked: 2CH + 8HN ≈ 0.12 MFLOP; bytes ≈ 8H (u, y in float32) + C (mask) + the chunk states,
  8HN/C = 1.5 KB per pass, ≈ 20 KB with the log-depth scan over T/C = 128 chunks.
- FFT + correction: 3 real FFTs of length 2T per channel ≈ 15·log2(2T)·H ≈ 0.04 MFLOP, but the
  correction (subtract `Re Σ_n c_n a_n^{t−s+1} S_{s−1}` from every token t of a document that
  starts at s > 0) needs per-token powers of an unbounded distance t − s (8HN FLOPs and HN complex
  exponentials) and the [T, H, N] states it reads: ≈ 98 KB per token, as much as the per-token
  scan it replaces, and it subtracts the leaked sum of earlier documents (cancellation in
  float32). The chunked form moves ~5× fewer bytes and is exact at every document start.

The intra term's two forms at pha-180m's GSS branch, [B, T, H] = [4, 8192, 192], C = 64
(X = 128 chunks), float32 (HIGHEST: no TF32, so cuBLAS/Triton f32 GEMMs on CUDA cores, H200
peak ≈ 67 TFLOP/s), U = one [B, X, C, H] float32 array = 25 MB, fwd + bwd (the backward needs no
recomputed y: the term is linear, its gradients are dT and du only):
- masked reduction: 3 reductions (y, du, dT) of B·X·C²·H = 0.40 G multiply-adds each,
  2.4 GFLOP in all, reading ≈ U + T + the [B, X, C, C] mask and writing U each (≈ 55 MB); they
  are XLA elementwise reductions at < 1 TFLOP/s on H200: 0.51 + 0.39 + 0.33 = 1.24 ms
  (experiments/benchmarks/results/s5a/pha.log; `fused_reduce.2` / `.3` in s4d's HLO).
- R = 3 matmuls: forward one batched GEMM (batch h = 192, M = C = 64, K = 64, N = R·B·X =
  1536) = 2.4 GFLOP; backward du (same GEMM transposed) and dT (K = R·B·X) 2.4 GFLOP each:
  7.2 GFLOP (3× the reductions' FLOPs, counting the causal zeros either way). Bytes, if XLA
  fuses no mask into a GEMM: forward ≈ 14 U (u, the R masked copies written and read, R
  products written and read, y), backward ≈ 24 U: ≈ 0.95 GB, 0.22 ms at 4.3 TB/s; the GEMMs
  at 40–60 TFLOP/s take 0.12–0.18 ms, so ≈ 0.2–0.3 ms in all, against 1.24 ms (the branch
  4.09 → ≈ 3.1 ms). When a batch falls back it costs what it did, plus the run-time predicate
  and u in chunks written once as the cond's operand (≈ U). XLA's GPU conditional reads its
  predicate on the host (a 1-byte copy and a stream sync per call, forward and backward): a
  gap of some µs per layer to look for in the trace.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import check_count, check_dims, check_floating
from hybrid_jax.ops.dispatch import Rung, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.scan import compute_dtype, linear_scan, to_chunks, varying_scan
from hybrid_jax.ops.segments import document_starts, reset_decay, reset_state

_OP = "dss"
_HIGHEST = jax.lax.Precision.HIGHEST


def _complex_dtype(*arrays: jax.Array | None) -> jnp.dtype:
    return jnp.promote_types(compute_dtype(*arrays), jnp.complex64)


def dss_discretize(
    log_dt: jax.Array,
    lambda_log_neg_re: jax.Array,
    lambda_im: jax.Array,
    w_re: jax.Array,
    w_im: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The discrete DSS-exp parameters from the raw (trainable, real) ones.

    Args:
      log_dt: `[H]` log step size per channel.
      lambda_log_neg_re: `[N]` (modes shared by all channels, as in DSS and GSS) or `[H, N]`:
        `Re λ = −exp(lambda_log_neg_re)`.
      lambda_im: same shape as `lambda_log_neg_re`: `Im λ`.
      w_re, w_im: `[H, N]` real and imaginary parts of the output weights W.

    Returns:
      `(log_decay, coeff)`, complex `[H, N]`: `log_decay = λΔ` (the state decays by
      `exp(log_decay)` per step) and `coeff = W (exp(λΔ) − 1) / λ`.
    """
    op = _OP + "_discretize"
    sizes = check_dims(op, {}, log_dt=(log_dt, "H"), w_re=(w_re, "HN"), w_im=(w_im, "HN"))
    layout = "N" if lambda_log_neg_re.ndim == 1 else "HN"
    check_dims(op, sizes, lambda_log_neg_re=(lambda_log_neg_re, layout),
               lambda_im=(lambda_im, layout))
    check_floating(op, log_dt=log_dt, lambda_log_neg_re=lambda_log_neg_re, lambda_im=lambda_im,
                   w_re=w_re, w_im=w_im)
    dtype = _complex_dtype(log_dt, lambda_log_neg_re, lambda_im, w_re, w_im)
    lam = jax.lax.complex(-jnp.exp(lambda_log_neg_re), lambda_im).astype(dtype)
    log_decay = jnp.exp(log_dt)[:, None].astype(dtype) * lam
    w = jax.lax.complex(w_re, w_im).astype(dtype)
    return log_decay, w * jnp.expm1(log_decay) / lam


@typed_like_inputs
def dss(
    u: jax.Array,
    log_decay: jax.Array,
    coeff: jax.Array,
    *,
    initial_state: jax.Array | None = None,
    return_final_state: bool = False,
    segment_ids: jax.Array | None = None,
    chunk_size: int = 64,
    implementation: str | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The diagonal SSM over a sequence (see the module docstring for the equations).

    Args:
      u: `[B, T, H]` real inputs (channels last).
      log_decay: `[H, N]` complex `λΔ` from `dss_discretize` (negative real part).
      coeff: `[H, N]` complex output coefficients from `dss_discretize`.
      initial_state: `[B, H, N]` complex state before the first token; None for zeros.
      return_final_state: also return the state after the last token.
      segment_ids: `[B, T]` packed-document ids; the state resets at each document start
        (`hybrid_jax.ops.segments`). A convolution cannot restart mid-sequence, so "fft" does
        not take them (auto then picks "xla", the chunked form).
      chunk_size: tokens per chunk of the "xla" rung (the others ignore it).
      implementation: "fft", "xla", "scan", "reference" or None (auto: "fft", "xla" with
        segment_ids).

    Returns:
      y `[B, T, H]` in u's dtype; with `return_final_state`, `(y, final_state)` where
      final_state is `[B, H, N]` complex64 (complex128 for float64 inputs).
    """
    _check(u, log_decay, coeff, initial_state)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{_OP}: chunk_size must be a positive integer, got {chunk_size!r}")
    starts = document_starts(_OP, segment_ids, u.shape[0], u.shape[1])
    y, final_state = dispatch(_OP, _RUNGS, implementation, u, log_decay, coeff,
                              initial_state=initial_state,
                              return_final_state=return_final_state, starts=starts,
                              chunk_size=chunk_size)
    return (y, final_state) if return_final_state else y


def _check_complex(op: str, **arrays: jax.Array | None) -> None:
    for name, x in arrays.items():
        if x is not None and not jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise ValueError(f"{op}: {name} must be a complex array (from dss_discretize), "
                             f"got dtype {x.dtype}")


def _check(u, log_decay, coeff, initial_state) -> None:
    sizes = check_dims(_OP, {}, u=(u, "BTH"), log_decay=(log_decay, "HN"), coeff=(coeff, "HN"))
    check_floating(_OP, u=u)
    _check_complex(_OP, log_decay=log_decay, coeff=coeff, initial_state=initial_state)
    if sizes["T"] < 1:
        raise ValueError(f"{_OP}: u needs at least one time step, got shape {tuple(u.shape)}")
    if initial_state is not None:
        check_dims(_OP, sizes, initial_state=(initial_state, "BHN"))


@typed_like_inputs
def dss_step(
    state: jax.Array, u: jax.Array, log_decay: jax.Array, coeff: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One token (decoding): state `[B, H, N]` complex, u `[B, H]` -> (y `[B, H]`, new state)."""
    op = _OP + "_step"
    check_dims(op, {}, state=(state, "BHN"), u=(u, "BH"), log_decay=(log_decay, "HN"),
               coeff=(coeff, "HN"))
    check_floating(op, u=u)
    _check_complex(op, state=state, log_decay=log_decay, coeff=coeff)
    dtype = _complex_dtype(state, u, log_decay, coeff)
    state = jnp.exp(log_decay.astype(dtype)) * state.astype(dtype) + u.astype(dtype)[..., None]
    y = jnp.einsum("bhn,hn->bh", state, coeff.astype(dtype)).real
    return y.astype(u.dtype), state


def dss_reference(u, log_decay, coeff, *, initial_state, return_final_state, starts,
                  chunk_size):
    """The definition: `dss_step` token by token with `lax.scan`, the state zeroed at document
    starts."""
    del return_final_state, chunk_size
    dtype = _complex_dtype(u, log_decay, coeff, initial_state)
    if initial_state is None:
        initial_state = jnp.zeros((u.shape[0], u.shape[2], log_decay.shape[-1]), dtype)
    starts = jnp.zeros(u.shape[:2], bool) if starts is None else starts

    def step(state, inputs):
        start, u_t = inputs
        y_t, state = dss_step(reset_state(state, start), u_t, log_decay, coeff)
        return state, y_t

    final_state, y = varying_scan(
        step, initial_state.astype(dtype), (jnp.moveaxis(starts, 1, 0), jnp.moveaxis(u, 1, 0)),
        log_decay, coeff)
    return jnp.moveaxis(y, 0, 1), final_state


def dss_scan(u, log_decay, coeff, *, initial_state, return_final_state, starts, chunk_size):
    """All states by `associative_scan` (memory O(B·T·H·N) complex); the decay is 0 at
    document starts."""
    del return_final_state, chunk_size
    dtype = _complex_dtype(u, log_decay, coeff, initial_state)
    inputs = jnp.broadcast_to(u.astype(dtype)[..., None], u.shape + coeff.shape[-1:])
    decay = jnp.exp(log_decay.astype(dtype))
    if starts is not None:
        decay = reset_decay(jnp.broadcast_to(decay, inputs.shape), starts)
    states = linear_scan(decay, inputs, initial_state, axis=1)  # [b,t,h,n]
    y = jnp.einsum("bthn,hn->bth", states, coeff.astype(dtype)).real
    return y.astype(u.dtype), states[:, -1]


def _split_powers(log_decay: jax.Array, length: int) -> tuple[jax.Array, jax.Array, int]:
    """Powers `exp(λΔ·k)`, k < length, as two small tables: `k = M·q + r`.

    Returns `(high [Q, H, N] = exp(λΔ·M·q), low [M, H, N] = exp(λΔ·r), M)` with `M·Q >= length`,
    M ≈ √length. Kernel, initial-state and final-state sums then become small complex matmuls
    over the modes instead of O(T·H·N) complex exponentials and a `[T, H, N]` temporary.
    """
    low_size = max(1, math.isqrt(length - 1) + 1)
    high_size = -(-length // low_size)
    real = jnp.finfo(log_decay.dtype).dtype
    low = jnp.exp(jnp.arange(low_size, dtype=real)[:, None, None] * log_decay)
    high = jnp.exp(jnp.arange(high_size, dtype=real)[:, None, None] * (low_size * log_decay))
    return high, low, low_size


def _power_sum(log_decay: jax.Array, weights: jax.Array, length: int) -> jax.Array:
    """`Σ_n weights_{…,h,n} exp(λ_{h,n}Δ·k)` for k < length: `weights [..., H, N] -> [length,
    ..., H]` (complex)."""
    high, low, low_size = _split_powers(log_decay, length)
    summed = jnp.einsum("qhn,...hn,rhn->qr...h", high, weights, low)
    return summed.reshape((-1,) + summed.shape[2:])[:length]


def dss_kernel(log_decay: jax.Array, coeff: jax.Array, length: int) -> jax.Array:
    """The convolution kernel `K_k = Re(Σ_n coeff_n exp(λ_n Δ k))`, k < length: `[length, H]`."""
    op = _OP + "_kernel"
    check_dims(op, {}, log_decay=(log_decay, "HN"), coeff=(coeff, "HN"))
    _check_complex(op, log_decay=log_decay, coeff=coeff)
    check_count(op, "length", length, 1)
    return _power_sum(log_decay, coeff, length).real


def dss_fft(u, log_decay, coeff, *, initial_state, return_final_state, starts, chunk_size):
    """Causal convolution with the materialised kernel via real FFTs of length ≥ 2T − 1.

    The initial state adds `Re(Σ_n c_n exp(λΔ)^{t+1} s_n)`; the final state is
    `exp(λΔ)^T s + Σ_j exp(λΔ)^{T−1−j} u_j`.
    """
    del starts, chunk_size  # starts: unsupported (see _fft_unsupported)
    T = u.shape[1]
    dtype = _complex_dtype(u, log_decay, coeff, initial_state)
    real_dtype = jnp.finfo(dtype).dtype
    log_decay, coeff = log_decay.astype(dtype), coeff.astype(dtype)
    kernel = dss_kernel(log_decay, coeff, T)  # [t,h]
    u_real = u.astype(real_dtype)
    n_fft = 1 << (2 * T - 1).bit_length()  # a power of two >= 2T − 1: no circular wrap-around
    y = jnp.fft.irfft(jnp.fft.rfft(u_real, n_fft, axis=1) * jnp.fft.rfft(kernel, n_fft, axis=0),
                      n_fft, axis=1)[:, :T]
    decay = jnp.exp(log_decay)
    if initial_state is not None:
        state = initial_state.astype(dtype)
        y = y + jnp.moveaxis(_power_sum(log_decay, coeff * decay * state, T).real, 0, 1)
    final_state = None
    if return_final_state:
        high, low, low_size = _split_powers(log_decay, T)
        pad = high.shape[0] * low_size - T
        # u reversed in time and padded at the end: u_rev[k] = u_{T−1−k}, k = M·q + r.
        u_rev = jnp.pad(u_real[:, ::-1], ((0, 0), (0, pad), (0, 0))).astype(dtype)
        u_rev = u_rev.reshape(u.shape[0], high.shape[0], low_size, u.shape[2])
        final_state = jnp.einsum("qhn,bqrh,rhn->bhn", high, u_rev, low)
        if initial_state is not None:
            final_state = final_state + jnp.exp(T * log_decay) * state
    return y.astype(u.dtype), final_state


@jax.custom_vjp
def _masked_toeplitz(toeplitz_CCH: jax.Array, same_BXCC: jax.Array, u_BXCH: jax.Array
                     ) -> jax.Array:
    """`y[b,x,i,h] = Σ_j toeplitz[i,j,h] · same[b,x,i,j] · u[b,x,j,h]`.

    The forward pass and each gradient are one reduction of a masked product with that
    reduction as its only consumer, so a GPU compiler fuses the product into it and no
    `[B, X, C, C, H]` array is written (autodiff of the plain expression would share one
    product between three reductions, or keep it as a residual).
    """
    return _masked_apply(toeplitz_CCH, same_BXCC, u_BXCH)


def _masked_apply(toeplitz_CCH, same_BXCC, u_BXCH):
    return jnp.sum(jnp.where(same_BXCC[..., None], toeplitz_CCH, 0) * u_BXCH[:, :, None], axis=3)


def _masked_toeplitz_fwd(toeplitz_CCH, same_BXCC, u_BXCH):
    return _masked_apply(toeplitz_CCH, same_BXCC, u_BXCH), (toeplitz_CCH, same_BXCC, u_BXCH)


def _masked_toeplitz_bwd(residuals, g_BXCH):
    toeplitz_CCH, same_BXCC, u_BXCH = residuals
    du = jnp.sum(jnp.where(same_BXCC[..., None], toeplitz_CCH, 0) * g_BXCH[:, :, :, None],
                 axis=2)
    dt = jnp.sum(jnp.where(same_BXCC[..., None], g_BXCH[:, :, :, None] * u_BXCH[:, :, None], 0),
                 axis=(0, 1))
    return dt.astype(toeplitz_CCH.dtype), None, du.astype(u_BXCH.dtype)


_masked_toeplitz.defvjp(_masked_toeplitz_fwd, _masked_toeplitz_bwd)


# R of the module docstring: chunks of up to this many documents take the matmul form.
_MATMUL_DOCUMENTS = 3


def document_ranks(docs_BXC: jax.Array) -> jax.Array:
    """Each token's document counted from its chunk's first token's: 0, 1, ... `[B, X, C]`
    (`docs` is any per-chunk count of document starts up to and including the token)."""
    return docs_BXC - docs_BXC[..., :1]


def fits_matmuls(ranks_BXC: jax.Array, documents: int = _MATMUL_DOCUMENTS) -> jax.Array:
    """Whether every chunk holds at most `documents` documents (a scalar bool): then the
    intra-chunk term is `documents` Toeplitz matmuls (`_document_matmuls`)."""
    return jnp.all(ranks_BXC[..., -1] < documents)


def _document_matmuls(toeplitz_CCH: jax.Array, ranks_BXC: jax.Array, u_BXCH: jax.Array,
                      documents: int = _MATMUL_DOCUMENTS) -> jax.Array:
    """`Σ_{r < documents} P_r ⊙ (T · (P_r ⊙ u))`, `P_r = [rank == r]`: per chunk, each document
    through the causal Toeplitz matrix alone. Exact when `fits_matmuls(ranks, documents)`. The
    R masked copies of u are one batched matmul (batch h, N = R·B·X), so are its gradients."""
    masks_RBXC1 = (ranks_BXC == jnp.arange(documents)[:, None, None, None])[..., None]
    y_RBXCH = jnp.einsum("ijh,rbxjh->rbxih", toeplitz_CCH, jnp.where(masks_RBXC1, u_BXCH, 0),
                         precision=_HIGHEST)
    return jnp.sum(jnp.where(masks_RBXC1, y_RBXCH, 0), axis=0)


def _intra_documents(toeplitz_CCH: jax.Array, docs_BXC: jax.Array, u_BXCH: jax.Array
                     ) -> jax.Array:
    """`y[b,x,i,h] = Σ_{j ≤ i, same document} toeplitz[i,j,h] u[b,x,j,h]`: matmuls when every
    chunk holds few enough documents, else the masked reduction (one of them runs)."""

    def matmuls(toeplitz_CCH, docs_BXC, u_BXCH):
        return _document_matmuls(toeplitz_CCH, document_ranks(docs_BXC), u_BXCH)

    def masked(toeplitz_CCH, docs_BXC, u_BXCH):
        lag = jnp.arange(docs_BXC.shape[-1])[:, None] - jnp.arange(docs_BXC.shape[-1])
        same = (docs_BXC[..., :, None] == docs_BXC[..., None, :]) & (lag >= 0)
        return _masked_toeplitz(toeplitz_CCH, same, u_BXCH)

    return jax.lax.cond(fits_matmuls(document_ranks(docs_BXC)), matmuls, masked,
                        toeplitz_CCH, docs_BXC, u_BXCH)


@jax.custom_vjp
def _materialized(x: jax.Array) -> jax.Array:
    """`x`, written to memory in the forward pass and its cotangent in the backward pass.

    A fusion barrier both ways (`optimization_barrier`). Without it, XLA's GPU compiler fused
    the backward of the chunk scan into the reduction of the chunk decay's gradient over
    (B, chunks), and the gather building the Toeplitz matrix into every masked reduction that
    reads it: 4.5 ms and 2 × 1.2 ms of pha-180m's 10 ms GSS-branch step at [4, 8192]
    (BENCHMARKS.md, "the GSS branch's pieces and kernels"); written once, each is a small array.
    """
    return jax.lax.optimization_barrier(x)


def _materialized_fwd(x):
    return jax.lax.optimization_barrier(x), None


def _materialized_bwd(_, g):
    return (jax.lax.optimization_barrier(g),)


_materialized.defvjp(_materialized_fwd, _materialized_bwd)


def _real_matmul(equation: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(equation, a, b, precision=_HIGHEST)


def dss_chunked(u, log_decay, coeff, *, initial_state, return_final_state, starts, chunk_size):
    """The chunked form (module docstring): Toeplitz inside chunks, chunk states between them.

    Under `jax.checkpoint`: the backward pass recomputes the chunk states (a fraction of the
    op's work) instead of keeping `[B, T/C, H, N]` complex arrays per layer until then.
    """
    del return_final_state  # the final state is a [B, H, N] contraction: always returned
    run = jax.checkpoint(functools.partial(_chunked, chunk_size=chunk_size))
    return run(u, log_decay, coeff, initial_state, starts)


def _chunked(u, log_decay, coeff, initial_state, starts, *, chunk_size):
    dtype = _complex_dtype(u, log_decay, coeff, initial_state)
    real = jnp.finfo(dtype).dtype
    batch, length, channels = u.shape
    modes = log_decay.shape[-1]
    size = min(chunk_size, length)
    u_x = to_chunks(u.astype(real), size)  # [b, x, C, h], zero-padded at the end
    chunks = u_x.shape[1]
    tail = length - (chunks - 1) * size  # real tokens of the last chunk, 1..C
    log_decay, coeff = log_decay.astype(dtype), coeff.astype(dtype)
    powers = jnp.exp(jnp.arange(size + 1, dtype=real)[:, None, None] * log_decay)  # a^k [k,h,n]
    kernel = jnp.einsum("khn,hn->kh", powers[:size], coeff, precision=_HIGHEST).real
    lag = jnp.arange(size)[:, None] - jnp.arange(size)[None, :]
    toeplitz = _materialized(
        jnp.where((lag >= 0)[..., None], kernel[jnp.maximum(lag, 0)], 0))  # [i, j, h]
    if starts is None:
        continues = None
        transmits = jnp.ones((batch, chunks), bool)
        u_last = u_x
        y = jnp.einsum("ijh,bxjh->bxih", toeplitz, u_x, precision=_HIGHEST)
    else:
        docs = jnp.cumsum(to_chunks(starts, size), axis=2)  # document index within the chunk
        continues = docs == 0  # [b, x, C]: still in the document entering the chunk
        transmits = docs[..., -1] == 0  # [b, x]: no start in the chunk (padding has none)
        # Only the chunk's last document reaches its end state.
        u_last = jnp.where((docs == docs[..., -1:])[..., None], u_x, 0)
        # `+ zeros_like(u)` gives the kernel u's varying mesh axes (inside a context-parallel
        # shard_map its gradient is a per-shard sum, and autodiff of this add adds the psum).
        y = _intra_documents(toeplitz + jnp.zeros_like(u_x[0, 0, :1]), docs, u_x)

    # State of each chunk's own tokens at its end, then carried across chunks.
    to_end = powers[size - 1::-1]  # a^{C−1−j}
    local = jax.lax.complex(_real_matmul("jhn,bxjh->bxhn", to_end.real, u_last),
                            _real_matmul("jhn,bxjh->bxhn", to_end.imag, u_last))
    decay = _materialized(jnp.where(transmits[..., None, None], powers[size], 0))  # [b,x,h,n]
    ends = linear_scan(decay, local, initial_state, axis=1)
    zero = jnp.zeros((batch, 1, channels, modes), dtype)
    entering = jnp.concatenate([zero if initial_state is None
                                else initial_state.astype(dtype)[:, None], ends[:, :-1]], axis=1)

    # What the entering state adds inside each chunk.
    out = coeff * powers[1:]  # c a^{i+1} [i, h, n]
    inter = (_real_matmul("ihn,bxhn->bxih", out.real, entering.real)
             - _real_matmul("ihn,bxhn->bxih", out.imag, entering.imag))
    y = y + (inter if continues is None else jnp.where(continues[..., None], inter, 0))
    y = y.reshape(batch, chunks * size, channels)[:, :length]

    # The final state: the last chunk's end with its powers shifted to its `tail` real tokens.
    shifted = jnp.where((jnp.arange(size) < tail)[:, None, None],
                        powers[jnp.maximum(tail - 1 - jnp.arange(size), 0)], 0)
    final = jnp.where(transmits[:, -1, None, None], powers[tail] * entering[:, -1], 0) + (
        jax.lax.complex(_real_matmul("jhn,bjh->bhn", shifted.real, u_last[:, -1]),
                        _real_matmul("jhn,bjh->bhn", shifted.imag, u_last[:, -1])))
    return y.astype(u.dtype), final


def _fft_unsupported(*args, starts, **kwargs) -> str | None:
    return None if starts is None else "a convolution cannot restart at document starts"


_RUNGS = (
    Rung("fft", dss_fft, _fft_unsupported),
    Rung("xla", dss_chunked),
    Rung("scan", dss_scan, auto=False),
    Rung("reference", dss_reference, auto=False),
)
