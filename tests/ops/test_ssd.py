"""ssd / ssd_step against an independent float64 numpy loop over tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops.ssd import ssd, ssd_step
from tests.helpers import assert_close, assert_directional_derivatives, assert_refused, normals

H, P, G, N = 4, 3, 2, 5


def numpy_ssd(x, dt, A, B, C, initial_state=None):
    """S_t = exp(dt_t A) S_{t−1} + dt_t x_t B_tᵀ, y_t = S_t C_t, per token (float64)."""
    x, dt, A, B, C = (np.asarray(a, np.float64) for a in (x, dt, A, B, C))
    batch, T, num_heads, head_dim = x.shape
    group = np.arange(num_heads) // (num_heads // B.shape[2])
    B_h, C_h = B[:, :, group], C[:, :, group]  # [b,t,h,n]
    state = (np.zeros((batch, num_heads, head_dim, B.shape[-1])) if initial_state is None
             else np.array(initial_state, np.float64))
    y = np.zeros_like(x)
    for t in range(T):
        decay = np.exp(dt[:, t] * A)[:, :, None, None]
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * B_h[:, t, :, None, :]
        y[:, t] = np.einsum("bhpn,bhn->bhp", state, C_h[:, t])
    return y, state


def _inputs(T, batch=2, seed=0, dtype=jnp.float64):
    x, dt_raw, A_raw, B, C, s0 = normals(seed, (batch, T, H, P), (batch, T, H), (H,),
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
        out = {"reference": ssd(*args, initial_state=s0, return_final_state=True,
                                implementation="reference")}
        for chunk in (16, 64):
            out[f"xla{chunk}"] = ssd(*args, chunk_size=chunk, initial_state=s0,
                                     return_final_state=True, implementation="xla")
        out["xla16_zero"] = ssd(*args, chunk_size=16, return_final_state=True)  # auto rung
        return out

    out = run(args, s0)
    expected = numpy_ssd(*args, s0)
    expected_zero = numpy_ssd(*args)
    for name, (y, final) in out.items():
        assert y.dtype == jnp.float64 and final.shape == (2, H, P, N)
        assert_close((y, final), expected_zero if name.endswith("zero") else expected, 1e-12,
                     f"T={T} {name}")


def test_skip_d_on_every_rung_and_step(x64):
    """y_t + D_h·x_t (Mamba-2's skip) against the numpy definition plus D·x, on the reference
    and chunked rungs and token by token with the step; its gradient w.r.t. D is Σ dy·x."""
    args, s0 = _inputs(37, seed=6)
    x = args[0]
    D = normals(7, (H,))
    expected_y, expected_final = numpy_ssd(*args, s0)
    expected_y = expected_y + np.asarray(D)[:, None] * np.asarray(x)
    for impl in ("reference", "xla"):
        out = jax.jit(lambda a, s, d, impl=impl: ssd(*a, chunk_size=16, initial_state=s, D=d,
                                                     return_final_state=True,
                                                     implementation=impl))(args, s0, D)
        assert_close(out, (expected_y, expected_final), 1e-12, impl)
    step = jax.jit(ssd_step)
    state, ys = s0, []
    for t in range(x.shape[1]):
        y_t, state = step(state, x[:, t], args[1][:, t], args[2], args[3][:, t], args[4][:, t], D)
        ys.append(y_t)
    assert_close((jnp.stack(ys, axis=1), state), (expected_y, expected_final), 1e-12, "steps")
    weights = normals(8, x.shape)
    grad = jax.grad(lambda d: jnp.sum(weights * ssd(*args, initial_state=s0, D=d,
                                                    implementation="xla")))(D)
    assert_close(grad, jnp.einsum("bthp,bthp->h", weights, x), 1e-12, "dD")


def _loss(impl, chunk_size=16):
    """A scalar touching every output and the final state, with uneven weights."""

    def loss(x, dt, A, B, C, s0):
        y, final = ssd(x, dt, A, B, C, chunk_size=chunk_size, initial_state=s0,
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
    args, s0 = _inputs(23, seed=2)
    inputs = (*args, s0)
    grads = jax.jit(jax.grad(_loss("reference"), tuple(range(6))))(*inputs)

    def numpy_loss(x, dt, A, B, C, s0):
        y, final = numpy_ssd(x, dt, A, B, C, s0)
        return np.sum(np.sin(y) * np.cos(y[..., ::-1])) + np.sum(final ** 2 * 0.3)

    assert_directional_derivatives({"reference": grads}, numpy_loss, inputs, seed=3)


def test_chaining_and_token_steps_equal_full_sequence(x64):
    args, s0 = _inputs(40, seed=4)
    run = jax.jit(lambda a, s, chunk: ssd(*a, chunk_size=chunk, initial_state=s,
                                          return_final_state=True), static_argnums=2)
    y_full, final_full = run(args, s0, 16)
    y_head, state = run(tuple(a if a.ndim == 1 else a[:, :21] for a in args), s0, 16)
    y_tail, final = run(tuple(a if a.ndim == 1 else a[:, 21:] for a in args), state, 8)
    assert_close((jnp.concatenate([y_head, y_tail], axis=1), final), (y_full, final_full), 1e-12)

    step = jax.jit(ssd_step)
    x, dt, A, B, C = args
    state, ys = s0, []
    for t in range(x.shape[1]):
        y_t, state = step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y_t)
    assert_close((jnp.stack(ys, axis=1), state), (y_full, final_full), 1e-12, "steps")


def test_bfloat16_inputs_keep_float32_state():
    args, s0 = _inputs(50, seed=5, dtype=jnp.float32)
    run = jax.jit(lambda a, s: ssd(*a, initial_state=s, chunk_size=16, return_final_state=True))
    y_ref, final_ref = run(args, s0)
    y, final = run(tuple(a.astype(jnp.bfloat16) for a in args), s0)
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    assert_close((y.astype(jnp.float32), final), (y_ref, final_ref), 3e-2)


def test_memory_is_linear_in_length_without_per_token_states():
    """Compiled temporaries (forward and backward) grow ~linearly in T and stay far below one
    [P, N] state per token."""
    batch, heads, head_dim, state_dim = 1, 2, 64, 64

    def temp_bytes(T):
        spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
        args = (spec(batch, T, heads, head_dim), spec(batch, T, heads), spec(heads),
                spec(batch, T, 1, state_dim), spec(batch, T, 1, state_dim))
        loss = lambda *a: jnp.sum(ssd(*a, chunk_size=64))
        grad = jax.jit(jax.grad(loss, argnums=tuple(range(5))))
        return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(2048), temp_bytes(4096)
    per_token_states = 4096 * heads * head_dim * state_dim * 4
    assert large < 2.3 * small, (small, large)
    assert large < per_token_states / 4, (large, per_token_states)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(B=lambda B: B[:, :, :1].repeat(3, axis=2), C=lambda C: C[:, :, :1].repeat(3, axis=2)),
         "num_groups .* must divide num_heads"),
        (dict(x=lambda x: x[0]), r"x must have shape \[B,T,H,P\]"),
        (dict(dt=lambda dt: dt[:, :-1]), "axis T of dt"),
        (dict(A=lambda A: A[:2]), "axis H of A"),
        (dict(C=lambda C: C[..., :2]), "axis N of C"),
        (dict(x=lambda x: x[:, :0], dt=lambda dt: dt[:, :0], B=lambda B: B[:, :0],
              C=lambda C: C[:, :0]), "at least one time step"),
        (dict(x=lambda x: x.astype(jnp.int32)), "x must be a floating-point array"),
        (dict(initial_state=lambda s: s[..., :2]), "axis N of initial_state"),
        (dict(chunk_size=0), "chunk_size must be a positive int"),
        (dict(chunk_size=2.5), "chunk_size must be a positive int, got 2.5"),
        (dict(B=lambda B: B[:, :, :0], C=lambda C: C[:, :, :0]),
         "num_groups .* must divide num_heads .*: 0 does not divide"),
        (dict(D=jnp.ones((H + 1,))), "axis H of D"),
        (dict(D=jnp.ones((H,), jnp.int32)), "D must be a floating-point array"),
        (dict(implementation="cudnn"), "implementation='cudnn' is not available"),
        (dict(implementation="pallas"), "implementation='pallas' cannot run this call"),
    ],
)
def test_bad_inputs_are_named(change, message):
    (x, dt, A, B, C), s0 = _inputs(4, dtype=jnp.float32)
    arrays = dict(x=x, dt=dt, A=A, B=B, C=C, initial_state=s0)
    assert_refused(ssd, arrays, change, message)


def test_step_bad_state_shape():
    (x, dt, A, B, C), s0 = _inputs(1, dtype=jnp.float32)
    with pytest.raises(ValueError, match="axis P of x"):
        ssd_step(s0, x[:, 0, :, :2], dt[:, 0], A, B[:, 0], C[:, 0])
