"""scan.py helpers against plain numpy loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from hybrid_jax.config import MeshConfig
from hybrid_jax.ops.scan import (
    causal_decay_matrix,
    chunk_scan,
    chunk_state_scan,
    compute_dtype,
    from_time_chunks,
    linear_scan,
    time_chunks,
    to_chunks,
    unit_lower_triangular_inverse,
    varying_scan,
)
from hybrid_jax.sharding import make_mesh
from tests.helpers import assert_close, normals


def numpy_linear_scan(a, b, h0, axis):
    a, b = np.broadcast_to(np.asarray(a), np.shape(b)), np.asarray(b)
    a, b = np.moveaxis(a, axis, 0), np.moveaxis(b, axis, 0)
    h = np.zeros(b.shape[1:], np.result_type(a, b)) if h0 is None else np.asarray(h0)
    out = []
    for a_t, b_t in zip(a, b, strict=True):
        h = a_t * h + b_t
        out.append(h)
    return np.moveaxis(np.stack(out), 0, axis)


@pytest.mark.parametrize("axis", [1, 0, -1])
@pytest.mark.parametrize("with_initial", [True, False])
def test_linear_scan_real(x64, axis, with_initial):
    a, b, h0 = normals(0, (2, 7, 3), (2, 7, 3), (2, 7, 3))
    h0 = jnp.take(h0, 0, axis=axis) if with_initial else None
    out = jax.jit(linear_scan, static_argnames="axis")(jnp.tanh(a), b, h0, axis=axis)
    assert_close(out, numpy_linear_scan(np.tanh(a), b, h0, axis % 3), 1e-12)


def test_linear_scan_refuses_an_initial_state_of_another_shape():
    """A state that merely broadcasts ([H, N] for [B, H, N]) gave every row the same start."""
    b = jnp.ones((2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 4, 5\) \(b's "
                                         r"\(2, 3, 4, 5\) without axis 1\), got \(4, 5\)"):
        linear_scan(b, b, jnp.ones((4, 5)))


def test_linear_scan_complex_broadcast_decay(x64):
    """A time-invariant complex decay `[H, N]` broadcast against inputs `[B, T, H, N]`."""
    a_re, a_im, b, h_re, h_im = normals(1, (3, 4), (3, 4), (2, 9, 3, 4), (2, 3, 4), (2, 3, 4))
    a = jnp.exp(-jnp.exp(a_re) + 1j * a_im)
    h0 = h_re + 1j * h_im
    out = jax.jit(linear_scan)(a, b, h0)
    assert out.dtype == jnp.complex128
    expected = numpy_linear_scan(a, b, h0, 1)
    for part in (np.real, np.imag):
        assert_close(part(out), part(expected), 1e-12)


def numpy_chunk_state_scan(decay, increment, initial):
    state = np.zeros(increment.shape[:1] + increment.shape[2:]) if initial is None else initial
    entering = []
    for c in range(increment.shape[1]):
        entering.append(state)
        state = decay[:, c] * state + increment[:, c]
    return np.stack(entering, axis=1), state


@pytest.mark.parametrize("decay_shape", [(2, 5, 3, 1, 1), (2, 5, 3, 4, 1), (2, 5, 3, 1, 6)])
@pytest.mark.parametrize("with_initial", [True, False])
def test_chunk_state_scan_scalar_row_and_column_decays(x64, decay_shape, with_initial):
    decay, increment, initial = normals(2, decay_shape, (2, 5, 3, 4, 6), (2, 3, 4, 6))
    decay = jax.nn.sigmoid(decay)
    initial = initial if with_initial else None
    entering, final = chunk_state_scan(decay, increment, initial, axis=1)
    expected = numpy_chunk_state_scan(np.asarray(decay), np.asarray(increment),
                                      None if initial is None else np.asarray(initial))
    assert entering.shape == increment.shape
    assert_close((entering, final), expected, 1e-12)


def test_chunk_scan_with_matrix_transition_and_other_axis(x64):
    """A non-elementwise update (S ← M_c S + U_c), chunk axis 0, pytree inputs."""
    M, U, S0 = normals(3, (4, 2, 3, 3), (4, 2, 3, 5), (2, 3, 5))
    update = lambda S, mu: jnp.einsum("bij,bjk->bik", mu[0], S) + mu[1]
    entering, final = chunk_scan(update, S0, (0.5 * M, U), axis=0)
    S, expected = np.asarray(S0), []
    for c in range(4):
        expected.append(S)
        S = np.einsum("bij,bjk->bik", 0.5 * np.asarray(M[c]), S) + np.asarray(U[c])
    assert_close((entering, final), (np.stack(expected), S), 1e-12)


def test_causal_decay_matrix_values_and_finite_gradients(x64):
    log_decay = -jnp.exp(normals(4, (2, 6)) + 6.0)  # steep: exp(c_t − c_s), s > t, overflows
    cum = jnp.cumsum(log_decay, axis=-1)
    out = causal_decay_matrix(cum)
    c = np.asarray(cum)
    expected = np.zeros((2, 6, 6))
    for t in range(6):
        for s in range(t + 1):
            expected[:, t, s] = np.exp(c[:, t] - c[:, s])
    assert_close(out, expected, 1e-12)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(causal_decay_matrix(jnp.cumsum(x, axis=-1)))))(
        log_decay)
    assert np.all(np.isfinite(grad))


def test_to_chunks_pads_with_zeros():
    x = jnp.arange(2 * 7 * 3, dtype=jnp.float32).reshape(2, 7, 3)
    chunks = to_chunks(x, 3)
    assert chunks.shape == (2, 3, 3, 3)
    np.testing.assert_array_equal(chunks.reshape(2, 9, 3)[:, :7], x)
    np.testing.assert_array_equal(chunks.reshape(2, 9, 3)[:, 7:], 0)
    assert to_chunks(x, 7, axis=-2).shape == (2, 1, 7, 3)


def test_compute_dtype():
    bf16, f32 = jnp.zeros(1, jnp.bfloat16), jnp.zeros(1, jnp.float32)
    assert compute_dtype(bf16) == jnp.float32
    assert compute_dtype(bf16, None, f32.astype(jnp.complex64)) == jnp.float32
    with jax.enable_x64(True):
        assert compute_dtype(bf16, jnp.zeros(1, jnp.float64)) == jnp.float64


@pytest.mark.parametrize("n", [1, 5, 16, 17, 64, 100])
def test_unit_lower_triangular_inverse(x64, n):
    """Against numpy's inverse of I + tril(A, -1), entries of A up to 1 (the delta rule's range);
    the diagonal and upper triangle of the input are ignored. Gradient against the closed form
    d(tr(W T)) / dA = −(T W T)ᵀ restricted to the strict lower triangle."""
    a = normals(n, (3, n, n))
    a = jnp.tanh(a)
    t = unit_lower_triangular_inverse(a)
    expected = np.linalg.inv(np.eye(n) + np.tril(np.asarray(a), -1))
    assert_close(t, expected, 1e-12, "inverse")
    w = normals(n + 1, (3, n, n))
    grad = jax.grad(lambda x: jnp.sum(w * unit_lower_triangular_inverse(x)))(a)
    closed = -np.swapaxes(expected @ np.swapaxes(np.asarray(w), -1, -2) @ expected, -1, -2)
    assert_close(grad, np.tril(closed, -1), 1e-11, "gradient")


def test_time_chunks_round_trip_drops_the_padding():
    x = jnp.arange(2 * 7 * 3, dtype=jnp.float32).reshape(2, 7, 3)
    chunks = time_chunks(x, 3)  # [NC, B, H, C]
    assert chunks.shape == (3, 2, 3, 3)
    np.testing.assert_array_equal(chunks[1, :, :, 0], x[:, 3])
    np.testing.assert_array_equal(chunks[2, :, :, 1:], 0)
    np.testing.assert_array_equal(from_time_chunks(chunks, 7), x)


def test_varying_scan_carry_varies_like_closed_over_arrays():
    """Inside a shard_map, a step reading a per-device array (closed over, not in `xs`) makes
    the carry vary over the mesh axis; the initial state is marked so from the start."""
    mesh = make_mesh(MeshConfig(data=2))

    def run(w, xs):
        return varying_scan(lambda c, x: (c + w * x, c), jnp.zeros(1), xs, w)[0]

    fn = jax.shard_map(run, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))
    got = jax.jit(fn)(jnp.asarray([1.0, 10.0]), jnp.ones(3))
    np.testing.assert_array_equal(got, [3.0, 30.0])


def test_chunk_state_scan_keeps_the_increments_dtype():
    """A float32 decay over bf16 increments: states in bf16, as documented."""
    decay = jnp.full((1, 3, 1, 1), 0.5, jnp.float32)
    increment = jnp.ones((1, 3, 2, 2), jnp.bfloat16)
    entering, final = chunk_state_scan(decay, increment, jnp.ones((1, 2, 2), jnp.float32))
    assert entering.dtype == final.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(entering, np.float32)[0, :, 0, 0], [1, 1.5, 1.75])
    np.testing.assert_array_equal(np.asarray(final, np.float32), 1.875)


def test_chunk_state_scan_negative_chunk_axis_without_initial_state():
    increment = jnp.ones((2, 1, 3))  # chunks last
    entering, final = chunk_state_scan(jnp.full((1, 1, 3), 0.5), increment, axis=-1)
    np.testing.assert_array_equal(entering[0, 0], [0, 1, 1.5])
    np.testing.assert_array_equal(final, jnp.full((2, 1), 1.75))
