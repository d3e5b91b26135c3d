"""selective_scan / selective_scan_step against an independent float64 numpy loop over tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops.selective_scan import selective_scan, selective_scan_step
from tests.helpers import assert_close, assert_directional_derivatives, assert_refused, normals

H, P, G, N = 4, 3, 2, 5


def numpy_selective_scan(x, dt, A, B, C, initial_state=None):
    """s_t = exp(dt_t A) ⊙ s_{t−1} + dt_t x_t B_t, y_t = s_t · C_t, per token (float64)."""
    x, dt, A, B, C = (np.asarray(a, np.float64) for a in (x, dt, A, B, C))
    batch, T, num_heads, channels = x.shape
    state = (np.zeros((batch, num_heads, channels, A.shape[-1])) if initial_state is None
             else np.array(initial_state, np.float64))
    y = np.zeros_like(x)
    heads_per_group = num_heads // B.shape[2]
    for t in range(T):
        for h in range(num_heads):
            g = h // heads_per_group
            for p in range(channels):
                decay = np.exp(dt[:, t, h, p, None] * A[h, p])  # [b, n]
                state[:, h, p] = (decay * state[:, h, p]
                                  + (dt[:, t, h, p] * x[:, t, h, p])[:, None] * B[:, t, g])
                y[:, t, h, p] = np.sum(state[:, h, p] * C[:, t, g], axis=-1)
    return y, state


def _inputs(T, batch=2, seed=0, dtype=jnp.float64):
    x, dt_raw, A_raw, B, C, s0 = normals(seed, (batch, T, H, P), (batch, T, H, P), (H, P, N),
                                         (batch, T, G, N), (batch, T, G, N), (batch, H, P, N),
                                         dtype=dtype)
    dt = 0.5 * jax.nn.softplus(dt_raw)  # positive steps
    A = -jnp.exp(0.5 * A_raw)  # negative rates
    return (x, dt, A, B, C), s0


@pytest.mark.parametrize("T", [1, 7, 64, 100, 257])
def test_rungs_match_numpy(x64, T):
    args, s0 = _inputs(T)

    @jax.jit
    def run(args, s0):
        out = {"reference": selective_scan(*args, initial_state=s0, return_final_state=True,
                                           implementation="reference")}
        for chunk in (16, 64):
            out[f"xla{chunk}"] = selective_scan(*args, chunk_size=chunk, initial_state=s0,
                                                return_final_state=True, implementation="xla")
        out["xla16_zero"] = selective_scan(*args, chunk_size=16, return_final_state=True)
        return out

    out = run(args, s0)
    expected = numpy_selective_scan(*args, s0)
    expected_zero = numpy_selective_scan(*args)
    for name, (y, final) in out.items():
        assert y.dtype == jnp.float64 and final.shape == (2, H, P, N)
        assert_close((y, final), expected_zero if name.endswith("zero") else expected, 1e-12,
                     f"T={T} {name}")


def _loss(impl, chunk_size=16):
    """A scalar touching every output and the final state, with uneven weights."""

    def loss(x, dt, A, B, C, s0):
        y, final = selective_scan(x, dt, A, B, C, chunk_size=chunk_size, initial_state=s0,
                                  return_final_state=True, implementation=impl)
        return jnp.sum(jnp.sin(y) * jnp.cos(y[..., ::-1])) + jnp.sum(final ** 2 * 0.3)

    return loss


@pytest.mark.parametrize("T, chunk", [(100, 16), (7, 64)])
def test_xla_gradients_match_reference(x64, T, chunk):
    args, s0 = _inputs(T, seed=1)
    argnums = tuple(range(6))
    g_ref = jax.jit(jax.grad(_loss("reference"), argnums))(*args, s0)
    g_xla = jax.jit(jax.grad(_loss("xla", chunk), argnums))(*args, s0)
    assert_close(g_xla, g_ref, 1e-10, f"grads T={T} chunk={chunk}")


def test_reference_gradients_match_numpy_finite_differences(x64):
    """Directional derivatives of the numpy definition vs autodiff of the reference rung."""
    args, s0 = _inputs(13, seed=2)
    inputs = (*args, s0)
    grads = jax.jit(jax.grad(_loss("reference"), tuple(range(6))))(*inputs)

    def numpy_loss(x, dt, A, B, C, s0):
        y, final = numpy_selective_scan(x, dt, A, B, C, s0)
        return np.sum(np.sin(y) * np.cos(y[..., ::-1])) + np.sum(final ** 2 * 0.3)

    assert_directional_derivatives({"reference": grads}, numpy_loss, inputs, seed=3)


def test_chaining_and_token_steps_equal_full_sequence(x64):
    args, s0 = _inputs(40, seed=4)
    run = jax.jit(lambda a, s, chunk: selective_scan(*a, chunk_size=chunk, initial_state=s,
                                                     return_final_state=True), static_argnums=2)
    split = lambda a, part: a if a.ndim == 3 else a[:, part]
    y_full, final_full = run(args, s0, 16)
    y_head, state = run(tuple(split(a, slice(0, 21)) for a in args), s0, 16)
    y_tail, final = run(tuple(split(a, slice(21, None)) for a in args), state, 8)
    assert_close((jnp.concatenate([y_head, y_tail], axis=1), final), (y_full, final_full), 1e-12)

    step = jax.jit(selective_scan_step)
    x, dt, A, B, C = args
    state, ys = s0, []
    for t in range(x.shape[1]):
        y_t, state = step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y_t)
    assert_close((jnp.stack(ys, axis=1), state), (y_full, final_full), 1e-12, "steps")


def test_bfloat16_inputs_keep_float32_state():
    args, s0 = _inputs(50, seed=5, dtype=jnp.float32)
    run = jax.jit(lambda a, s: selective_scan(*a, initial_state=s, chunk_size=16,
                                              return_final_state=True))
    y_ref, final_ref = run(args, s0)
    y, final = run(tuple(a.astype(jnp.bfloat16) for a in args), s0)
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    assert_close((y.astype(jnp.float32), final), (y_ref, final_ref), 3e-2)


def test_memory_is_linear_in_length_without_per_token_states():
    """Compiled temporaries (forward and backward) grow ~linearly in T, by far less than one
    [P, N] state per added token, and stay below the per-token states of the whole sequence."""
    batch, heads, channels, state_dim = 1, 1, 32, 16

    def temp_bytes(T):
        spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
        args = (spec(batch, T, heads, channels), spec(batch, T, heads, channels),
                spec(heads, channels, state_dim), spec(batch, T, 1, state_dim),
                spec(batch, T, 1, state_dim))
        loss = lambda *a: jnp.sum(selective_scan(*a, chunk_size=64))
        grad = jax.jit(jax.grad(loss, argnums=tuple(range(5))))
        return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(4096), temp_bytes(8192)
    state_bytes_per_token = heads * channels * state_dim * 4
    assert large < 2.3 * small, (small, large)
    assert large - small < 4096 * state_bytes_per_token / 4, (small, large)
    assert large < 8192 * state_bytes_per_token / 2, (large, 8192 * state_bytes_per_token)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(B=lambda B: B[:, :, :1].repeat(3, axis=2), C=lambda C: C[:, :, :1].repeat(3, axis=2)),
         "num_groups .* must divide num_heads"),
        (dict(x=lambda x: x[0]), r"x must have shape \[B,T,H,P\]"),
        (dict(dt=lambda dt: dt[:, :-1]), "axis T of dt"),
        (dict(dt=lambda dt: dt[..., 0]), r"dt must have shape \[B,T,H,P\]"),
        (dict(A=lambda A: A[:2]), "axis H of A"),
        (dict(C=lambda C: C[..., :2]), "axis N of C"),
        (dict(x=lambda x: x[:, :0], dt=lambda dt: dt[:, :0], B=lambda B: B[:, :0],
              C=lambda C: C[:, :0]), "at least one time step"),
        (dict(x=lambda x: x.astype(jnp.int32)), "x must be a floating-point array"),
        (dict(initial_state=lambda s: s[..., :2]), "axis N of initial_state"),
        (dict(chunk_size=0), "chunk_size must be a positive int"),
        (dict(implementation="pallas"), "implementation='pallas' is not available"),
    ],
)
def test_bad_inputs_are_named(change, message):
    (x, dt, A, B, C), s0 = _inputs(4, dtype=jnp.float32)
    arrays = dict(x=x, dt=dt, A=A, B=B, C=C, initial_state=s0)
    assert_refused(selective_scan, arrays, change, message)


def test_step_bad_state_shape():
    (x, dt, A, B, C), s0 = _inputs(1, dtype=jnp.float32)
    with pytest.raises(ValueError, match="axis P of x"):
        selective_scan_step(s0, x[:, 0, :, :2], dt[:, 0], A, B[:, 0], C[:, 0])
