"""dss / dss_step / dss_discretize against independent float64 numpy definitions; the chunked
rung against the per-token reference with documents, odd lengths and initial states."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops.dss import (
    _MATMUL_DOCUMENTS,
    _document_matmuls,
    _masked_apply,
    document_ranks,
    dss,
    dss_discretize,
    dss_kernel,
    dss_step,
    fits_matmuls,
)
from hybrid_jax.ops.scan import to_chunks
from hybrid_jax.ops.segments import document_starts
from tests.helpers import assert_close as assert_close_real
from tests.helpers import assert_directional_derivatives, assert_refused, normals

H, N = 3, 4
RUNGS = ("reference", "xla", "scan", "fft")


def assert_close(actual, expected, tol, what=""):
    """`tests.helpers.assert_close` on complex leaves split into (real, imag) parts."""
    split = lambda tree: jax.tree.map(lambda a: np.stack([np.real(a), np.imag(a)]), tree)
    assert_close_real(split(actual), split(expected), tol, what)


def numpy_discretize(log_dt, lambda_log_neg_re, lambda_im, w_re, w_im):
    lam = -np.exp(np.asarray(lambda_log_neg_re, np.float64)) + 1j * np.asarray(lambda_im)
    lam_dt = lam * np.exp(np.asarray(log_dt, np.float64))[:, None]  # [H, N]
    w = np.asarray(w_re, np.float64) + 1j * np.asarray(w_im)
    return lam, lam_dt, w


def numpy_dss(u, raw, initial_state=None):
    """s_t = exp(λΔ) s_{t−1} + u_t, y_t = Re(Σ_n W (exp(λΔ) − 1)/λ · s_t), per token (float64)."""
    lam, lam_dt, w = numpy_discretize(*raw)
    coeff = w * (np.exp(lam_dt) - 1) / lam
    u = np.asarray(u, np.float64)
    batch, T, num_channels = u.shape
    state = (np.zeros((batch, num_channels, lam_dt.shape[-1]), complex) if initial_state is None
             else np.array(initial_state, complex))
    y = np.zeros_like(u)
    for t in range(T):
        state = np.exp(lam_dt) * state + u[:, t, :, None]
        y[:, t] = np.sum(coeff * state, axis=-1).real
    return y, state


def _raw(seed, lambda_shape=(N,), dtype=jnp.float64):
    log_dt, lre, lim, w_re, w_im = normals(seed, (H,), lambda_shape, lambda_shape, (H, N), (H, N),
                                           dtype=dtype)
    return (0.5 * log_dt - 1.0, 0.5 * lre - 0.7, 3.0 * lim, w_re, w_im)


def _inputs(T, batch=2, seed=0, dtype=jnp.float64):
    u, s_re, s_im = normals(seed, (batch, T, H), (batch, H, N), (batch, H, N), dtype=dtype)
    return u, _raw(seed + 100, dtype=dtype), jax.lax.complex(s_re, s_im)


@pytest.mark.parametrize("T", [1, 7, 64, 100, 257])
def test_rungs_match_numpy(x64, T):
    u, raw, s0 = _inputs(T)

    @jax.jit
    def run(u, raw, s0):
        params = dss_discretize(*raw)
        out = {impl: dss(u, *params, initial_state=s0, return_final_state=True,
                         implementation=impl, chunk_size=16) for impl in RUNGS}
        for impl in ("xla", "scan", "fft"):
            out[impl + "_zero"] = dss(u, *params, return_final_state=True, implementation=impl,
                                      chunk_size=16)
        out["auto"] = (dss(u, *params, initial_state=s0), out["fft"][1])
        return out

    out = run(u, raw, s0)
    expected, expected_zero = numpy_dss(u, raw, s0), numpy_dss(u, raw)
    for name, (y, final) in out.items():
        assert y.dtype == jnp.float64 and final.dtype == jnp.complex128
        assert_close((y, final), expected_zero if name.endswith("zero") else expected, 1e-12,
                     f"T={T} {name}")


def test_per_channel_modes_and_kernel_formula(x64):
    """Λ per channel `[H, N]`; the kernel is DSS-exp's `Re(W Λ⁻¹(e^{ΛΔ} − 1) e^{λ k Δ})`, and
    the recurrence equals the causal convolution with it."""
    T = 33
    u, _, _ = _inputs(T, seed=5)
    raw = _raw(6, lambda_shape=(H, N))

    @jax.jit
    def run(u, raw):
        params = dss_discretize(*raw)
        return dss_kernel(*params, T), {impl: dss(u, *params, implementation=impl,
                                                  chunk_size=8) for impl in RUNGS}

    kernel, out = run(u, raw)
    lam, lam_dt, w = numpy_discretize(*raw)
    k = np.arange(T)
    expected = np.stack([
        (w[h] / lam[h] * (np.exp(lam_dt[h]) - 1) @ np.exp(lam_dt[h][:, None] * k)).real
        for h in range(H)
    ], axis=1)
    assert_close(kernel, expected, 1e-12, "kernel")

    conv = np.array([[np.convolve(np.asarray(u)[b, :, h], expected[:, h])[:T] for h in range(H)]
                     for b in range(u.shape[0])]).transpose(0, 2, 1)
    assert_close(numpy_dss(u, raw)[0], conv, 1e-12, "numpy recurrence vs convolution")
    for impl, y in out.items():
        assert_close(y, conv, 1e-12, impl)


def _loss(impl, segment_ids=None, chunk_size=16):
    """A scalar of every output and the final state, as a function of raw (real) inputs."""

    def loss(u, raw, s_re, s_im):
        y, final = dss(u, *dss_discretize(*raw), initial_state=jax.lax.complex(s_re, s_im),
                       return_final_state=True, implementation=impl, segment_ids=segment_ids,
                       chunk_size=chunk_size)
        return (jnp.sum(jnp.sin(y) * jnp.cos(y[:, ::-1])) + 0.3 * jnp.sum(jnp.abs(final) ** 2)
                + jnp.sum(0.7 * final.real - 0.2 * final.imag))

    return loss


def test_gradients_match_reference(x64):
    u, raw, s0 = _inputs(100, seed=7)
    inputs = (u, raw, s0.real, s0.imag)
    grads = jax.jit(lambda *a: {impl: jax.grad(_loss(impl), (0, 1, 2, 3))(*a)
                                for impl in RUNGS})(*inputs)
    for impl in ("xla", "scan", "fft"):
        assert_close(grads[impl], grads["reference"], 1e-10, f"{impl} grads")


# Document starts for chunks of 8 at T = 29 (the last chunk holds 5 tokens), one batch row per
# layout: on chunk edges (chunk position 0), inside chunks, one-token documents (consecutive
# starts, token 1, the partial last chunk), a chunk lying inside one document, and a single
# document (the initial state reaches all of it). Every chunk holds at most 3 documents (the
# intra-chunk matmuls), except with MANY_DOCUMENTS: chunk 8..15 of its third row holds 4 (the
# masked reduction).
DOCUMENT_STARTS = ((8, 16, 24), (3, 13, 27), (1, 2, 9, 10, 28), (5, 21), ())
MANY_DOCUMENTS = DOCUMENT_STARTS[:2] + ((1, 2, 9, 10, 11, 28),) + DOCUMENT_STARTS[3:]


def _segment_ids(T, rows):
    ids = np.zeros((len(rows), T), np.int32)
    for row, starts in enumerate(rows):
        for s in starts:
            ids[row, s:] += 1
    return jnp.asarray(ids)


def _ranks(segment_ids, chunk):
    """`document_ranks` of the chunked rung's chunks, from segment ids."""
    starts = document_starts("test", segment_ids, *segment_ids.shape)
    return document_ranks(jnp.cumsum(to_chunks(starts, chunk), axis=2))


def test_document_ranks_and_the_matmul_predicate():
    # Chunks of 4: a start at a chunk's position 0 is rank 0 there; ranks count documents.
    ranks = _ranks(_segment_ids(12, [(4, 6, 7), (1, 2, 3, 9)]), 4)
    np.testing.assert_array_equal(ranks, [[[0] * 4, [0, 0, 1, 2], [0] * 4],
                                          [[0, 1, 2, 3], [0] * 4, [0, 1, 1, 1]]])
    assert fits_matmuls(ranks, 4) and not fits_matmuls(ranks, 3)
    assert fits_matmuls(ranks[:1], 3) and not fits_matmuls(ranks[:1], 2)
    assert _MATMUL_DOCUMENTS == 3  # DOCUMENT_STARTS / MANY_DOCUMENTS are laid out for it
    assert fits_matmuls(_ranks(_segment_ids(29, DOCUMENT_STARTS), 8))
    assert not fits_matmuls(_ranks(_segment_ids(29, MANY_DOCUMENTS), 8))
    assert fits_matmuls(_ranks(_segment_ids(29, MANY_DOCUMENTS[3:]), 8))


def test_document_matmuls_equal_the_masked_reduction_only_when_they_fit():
    """The two intra-chunk forms directly: equal where every chunk holds ≤ 3 documents, and the
    matmuls drop the 4th document of a chunk (so the run-time choice matters)."""
    C = 8
    toeplitz, u = normals(3, (C, C, H), (5, 4, C, H), dtype=jnp.float32)
    toeplitz = jnp.tril(jnp.moveaxis(toeplitz, -1, 0)).transpose(1, 2, 0)
    docs = jnp.cumsum(to_chunks(document_starts("test", _segment_ids(32, MANY_DOCUMENTS), 5, 32),
                                C), axis=2)
    same = (docs[..., :, None] == docs[..., None, :]) & jnp.tril(jnp.ones((C, C), bool))
    matmuls, masked = _document_matmuls(toeplitz, document_ranks(docs), u), _masked_apply(
        toeplitz, same, u)
    fits = np.asarray(document_ranks(docs)[..., -1] < 3)
    assert fits.sum() == fits.size - 1
    np.testing.assert_allclose(np.asarray(matmuls)[fits], np.asarray(masked)[fits], atol=1e-5)
    assert np.abs(np.asarray(matmuls - masked)[~fits]).max() > 1e-2


@pytest.mark.parametrize("rows", [DOCUMENT_STARTS, MANY_DOCUMENTS], ids=["matmuls", "masked"])
def test_chunked_matches_reference_with_documents(x64, rows):
    """Values, final state and gradients (inputs, parameters, initial state) of the chunked rung
    against the per-token reference, documents on and off chunk edges, odd length; with every
    chunk's intra term as matmuls, and with one chunk too many documents for them."""
    T = 29
    u, raw, s0 = _inputs(T, batch=len(rows), seed=12)
    seg = _segment_ids(T, rows)
    inputs = (u, raw, s0.real, s0.imag)

    @jax.jit
    def run(*inputs):
        return {impl: (jax.value_and_grad(_loss(impl, seg, chunk_size=8), (0, 1, 2, 3))(*inputs),
                       dss(u, *dss_discretize(*raw), initial_state=s0, segment_ids=seg,
                           return_final_state=True, implementation=impl, chunk_size=8))
                for impl in ("reference", "xla")}

    out = run(*inputs)
    (loss, grads), values = out["xla"]
    (loss_ref, grads_ref), values_ref = out["reference"]
    assert_close(values, values_ref, 1e-12, "values and final states")
    assert_close((loss, grads), (loss_ref, grads_ref), 1e-10, "loss and gradients")
    assert_close(values_ref[0][-1], numpy_dss(u[-1:], raw, s0[-1:])[0][0], 1e-12, "one document")


def test_chunked_under_vmap_takes_each_rows_branch(x64):
    """vmap turns the run-time choice into a select of both forms: still the reference's."""
    T = 29
    u, raw, s0 = _inputs(T, batch=2 * len(DOCUMENT_STARTS), seed=14)
    seg = jnp.stack([_segment_ids(T, DOCUMENT_STARTS), _segment_ids(T, MANY_DOCUMENTS)])
    params = dss_discretize(*raw)
    run = jax.jit(jax.vmap(
        lambda u, s, ids, impl: dss(u, *params, initial_state=s, segment_ids=ids,
                                    return_final_state=True, implementation=impl, chunk_size=8),
        in_axes=(0, 0, 0, None)), static_argnums=3)
    split = lambda x: x.reshape((2, -1) + x.shape[1:])  # noqa: E731
    assert_close(run(split(u), split(s0), seg, "xla"), run(split(u), split(s0), seg, "reference"),
                 1e-12)


@pytest.mark.parametrize("T,chunk", [(1, 8), (8, 8), (9, 8), (40, 1), (33, 64)])
def test_chunked_odd_lengths_and_chunk_sizes(x64, T, chunk):
    u, raw, s0 = _inputs(T, seed=13)
    seg = _segment_ids(T, [[t for t in (3, 8, 16) if t < T], []])
    params = dss_discretize(*raw)
    run = jax.jit(lambda impl, **kw: dss(u, *params, initial_state=s0, segment_ids=seg,
                                         return_final_state=True, implementation=impl, **kw),
                  static_argnums=0, static_argnames="chunk_size")
    assert_close(run("xla", chunk_size=chunk), run("reference"), 1e-12, f"T={T} C={chunk}")


def test_auto_picks_the_chunked_rung_for_packed_text():
    from hybrid_jax.ops.dispatch import choose
    from hybrid_jax.ops.dss import _RUNGS

    u, raw, _ = _inputs(16, dtype=jnp.float32)
    kwargs = dict(initial_state=None, return_final_state=False, chunk_size=8)
    packed = choose("dss", _RUNGS, None, u, *dss_discretize(*raw),
                    starts=jnp.zeros((2, 16), bool), **kwargs)
    assert packed[0].name == "xla" and "fft: a convolution cannot restart" in packed[1][0]
    assert choose("dss", _RUNGS, None, u, *dss_discretize(*raw), starts=None,
                  **kwargs)[0].name == "fft"


def test_reference_gradients_match_numpy_finite_differences(x64):
    """Directional derivatives of the numpy definition vs autodiff of the reference rung."""
    u, raw, s0 = _inputs(23, seed=8)
    flat = (u, *raw, s0.real, s0.imag)
    loss = _loss("reference")
    grads = jax.jit(jax.grad(lambda u, *r: loss(u, r[:5], *r[5:]), tuple(range(8))))(*flat)

    def numpy_loss(u, *rest):
        y, final = numpy_dss(u, rest[:5], rest[5] + 1j * rest[6])
        return (np.sum(np.sin(y) * np.cos(y[:, ::-1])) + 0.3 * np.sum(np.abs(final) ** 2)
                + np.sum(0.7 * final.real - 0.2 * final.imag))

    assert_directional_derivatives({"reference": grads}, numpy_loss, flat, seed=9)


def test_chaining_and_token_steps_equal_full_sequence(x64):
    u, raw, s0 = _inputs(40, seed=10)
    params = dss_discretize(*raw)
    run = jax.jit(lambda u, s, impl: dss(u, *params, initial_state=s, return_final_state=True,
                                         implementation=impl), static_argnums=2)
    y_full, final_full = run(u, s0, "fft")
    y_head, state = run(u[:, :17], s0, "fft")
    y_tail, final = run(u[:, 17:], state, "xla")
    assert_close((jnp.concatenate([y_head, y_tail], axis=1), final), (y_full, final_full), 1e-12)

    step = jax.jit(dss_step)
    state, ys = s0, []
    for t in range(u.shape[1]):
        y_t, state = step(state, u[:, t], *params)
        ys.append(y_t)
    assert_close((jnp.stack(ys, axis=1), state), (y_full, final_full), 1e-12, "steps")


def test_float32_accuracy_and_bfloat16_dtypes():
    u, raw, s0 = _inputs(257, seed=11, dtype=jnp.float32)
    expected = numpy_dss(u, raw, s0)

    @jax.jit
    def run(u, raw, s0):
        params = dss_discretize(*raw)
        out = {impl: dss(u, *params, initial_state=s0, return_final_state=True,
                         implementation=impl, chunk_size=32) for impl in RUNGS}
        out["bf16"] = dss(u.astype(jnp.bfloat16), *params, initial_state=s0,
                          return_final_state=True)
        return out

    out = run(u, raw, s0)
    for impl in RUNGS:
        assert out[impl][0].dtype == jnp.float32 and out[impl][1].dtype == jnp.complex64
        assert_close(out[impl], expected, 1e-5, impl)
    y, final = out["bf16"]
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.complex64
    assert_close((y.astype(jnp.float32), final), expected, 2e-2, "bf16")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(u=lambda u: u[0]), r"u must have shape \[B,T,H\]"),
        (dict(u=lambda u: u[:, :0]), "at least one time step"),
        (dict(u=lambda u: u.astype(jnp.int32)), "u must be a floating-point array"),
        (dict(log_decay=lambda a: a.real), "log_decay must be a complex array"),
        (dict(coeff=lambda c: c[:2]), "axis H of coeff"),
        (dict(initial_state=lambda s: s[..., :2]), "axis N of initial_state"),
        (dict(implementation="pallas"), "implementation='pallas' is not available"),
        (dict(chunk_size=0), "chunk_size must be a positive integer"),
    ],
)
def test_bad_inputs_are_named(change, message):
    u, raw, s0 = _inputs(4, dtype=jnp.float32)
    log_decay, coeff = dss_discretize(*raw)
    arrays = dict(u=u, log_decay=log_decay, coeff=coeff, initial_state=s0)
    assert_refused(dss, arrays, change, message)


@pytest.mark.parametrize("change, message", [
    (dict(length=0), "dss_kernel: length must be an int >= 1, got 0"),  # was isqrt's error
    (dict(length=4.0), "dss_kernel: length must be an int >= 1, got 4.0"),
    (dict(log_decay=lambda a: a[0]), r"dss_kernel: log_decay must have shape \[H,N\]"),
    (dict(coeff=lambda c: c[:, :2]), "dss_kernel: axis N of coeff"),
    (dict(coeff=lambda c: c.real), "dss_kernel: coeff must be a complex array"),
])
def test_bad_kernel_arguments_are_named(change, message):
    log_decay, coeff = dss_discretize(*_raw(0, dtype=jnp.float32))
    args = dict(log_decay=log_decay, coeff=coeff, length=4)
    args.update({name: f(args[name]) if callable(f) else f for name, f in change.items()})
    with pytest.raises(ValueError, match=message):
        dss_kernel(**args)


def test_bad_raw_parameters_and_step_are_named():
    log_dt, lre, lim, w_re, w_im = _raw(0, dtype=jnp.float32)
    with pytest.raises(ValueError, match="axis N of lambda_im"):
        dss_discretize(log_dt, lre, lim[:2], w_re, w_im)
    with pytest.raises(ValueError, match="axis H of w_re"):
        dss_discretize(log_dt, lre, lim, w_re[:1], w_im)
    u, raw, s0 = _inputs(1, dtype=jnp.float32)
    with pytest.raises(ValueError, match="state must be a complex array"):
        dss_step(s0.real, u[:, 0], *dss_discretize(*raw))
