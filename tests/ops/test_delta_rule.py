"""gated_delta_rule: reference and chunked rungs against a float64 numpy per-token loop; which
rung auto picks on a GPU (the Pallas kernels are tested in tests/pallas)."""

import functools
import importlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops import dispatch
from hybrid_jax.ops.delta_rule import gated_delta_rule, gated_delta_rule_step
from pallas_kernels.delta_rule import api as pallas_delta_rule
from tests.helpers import assert_close, assert_directional_derivatives, lower_for_tpu, normals


def numpy_delta_rule(q, k, v, g, beta, scale, initial_state=None):
    """The recurrence as written in the docstring, one token at a time, in float64."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    B, T, H, K = q.shape
    S = np.zeros((B, H, K, v.shape[-1])) if initial_state is None else (
        np.array(initial_state, np.float64))
    out = np.zeros(v.shape)
    for t in range(T):
        S = np.exp(g[:, t])[:, :, None, None] * S
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out[:, t] = np.einsum("bhkv,bhk->bhv", S, scale * q[:, t])
    return out, S


def _inputs(T, *, B=2, H=2, K=4, V=5, seed=0, gate_scale=(0.05, 1.0), dtype=jnp.float64):
    """q, k (L2-normalised, as the modules pass them), v, g ≤ 0 (one scale per head), β in
    (0, 1), and an initial state."""
    q, k, v, g, beta, state = (np.asarray(a) for a in normals(
        seed, (B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H), (B, T, H), (B, H, K, V),
        dtype=dtype))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    g = -np.exp(g) * np.asarray(gate_scale)
    beta = 1 / (1 + np.exp(-beta))
    return tuple(jnp.asarray(a, dtype) for a in (q, k, v, g, beta, state))


@functools.partial(jax.jit, static_argnames=("implementation", "chunk_size"))
def _run(q, k, v, g, beta, initial_state, *, implementation, chunk_size=64):
    return gated_delta_rule(q, k, v, g, beta, initial_state=initial_state, chunk_size=chunk_size,
                            return_final_state=True, implementation=implementation)


@pytest.mark.parametrize("T", [1, 7, 64, 100, 257])
def test_rungs_match_numpy(x64, T):
    q, k, v, g, beta, state = _inputs(T)
    expected = numpy_delta_rule(q, k, v, g, beta, 4**-0.5, state)
    assert_close(_run(q, k, v, g, beta, state, implementation="reference"), expected, 1e-12,
                 "reference")
    for chunk_size in (16, 64):
        assert_close(_run(q, k, v, g, beta, state, implementation="xla", chunk_size=chunk_size),
                     expected, 1e-10, f"xla chunk {chunk_size}")


def test_zero_initial_state_and_scale(x64):
    q, k, v, g, beta, _ = _inputs(100, seed=1)
    expected = numpy_delta_rule(q, k, v, g, beta, 0.7)
    for impl in ("reference", "xla"):
        out = jax.jit(functools.partial(gated_delta_rule, scale=0.7, chunk_size=16,
                                        return_final_state=True, implementation=impl))(
            q, k, v, g, beta)
        assert_close(out, expected, 1e-10, impl)


def test_initial_state_chains(x64):
    """[0:t] then [t:T] from the carried state equals [0:T] in one call."""
    q, k, v, g, beta, state = _inputs(100, seed=2)
    full_out, full_state = _run(q, k, v, g, beta, state, implementation="xla", chunk_size=16)
    first_out, mid_state = _run(*(x[:, :37] for x in (q, k, v, g, beta)), state,
                                implementation="xla", chunk_size=16)
    second_out, end_state = _run(*(x[:, 37:] for x in (q, k, v, g, beta)), mid_state,
                                 implementation="xla", chunk_size=16)
    assert_close(jnp.concatenate([first_out, second_out], axis=1), full_out, 1e-12, "outputs")
    assert_close(end_state, full_state, 1e-12, "state")


def _numpy_loss(weights, scale, *args):
    out, state = numpy_delta_rule(*args[:5], scale, args[5])
    return np.sum(weights[0] * out) + np.sum(weights[1] * state)


@pytest.mark.parametrize("T, chunk_size", [(40, 16), (7, 64)])
def test_gradients_match_reference_and_numpy(x64, T, chunk_size):
    """Gradients w.r.t. q, k, v, g, β and the initial state of a loss on outputs and final state:
    xla against reference, and both against central differences of the numpy loop."""
    args = _inputs(T, seed=3)
    weights = normals(4, (2, T, 2, 5), (2, 2, 4, 5))

    def loss(impl, *a):
        out, state = gated_delta_rule(*a[:5], initial_state=a[5], chunk_size=chunk_size,
                                      return_final_state=True, implementation=impl)
        return jnp.sum(weights[0] * out) + jnp.sum(weights[1] * state)

    grads = {impl: jax.jit(jax.grad(functools.partial(loss, impl), argnums=tuple(range(6))))(*args)
             for impl in ("reference", "xla")}
    assert_close(grads["xla"], grads["reference"], 1e-10, "xla vs reference")
    assert_directional_derivatives(grads, functools.partial(_numpy_loss, weights, 0.5), args,
                                   seed=5)


def test_no_lapack_triangular_solve_in_training_graph():
    """jaxlib's CPU triangular solve deadlocks when two run at once on XLA's intra-op pool (every
    GDN model hung at its first training step on 2 cores): the chunked rung and its gradient
    must not contain one."""
    args = _inputs(40, seed=6, dtype=jnp.float32)[:5]
    grad = jax.grad(lambda *a: jnp.sum(gated_delta_rule(*a, chunk_size=16, implementation="xla")),
                    argnums=(0, 1, 2, 3, 4))
    assert "triangular_solve" not in str(jax.make_jaxpr(grad)(*args))


def test_step_matches_numpy(x64):
    q, k, v, g, beta, state = _inputs(7, seed=6)
    expected_out, expected_state = numpy_delta_rule(q, k, v, g, beta, 4**-0.5, state)
    step = jax.jit(gated_delta_rule_step)
    for t in range(7):
        out, state = step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        assert_close(out, expected_out[:, t], 1e-12, f"step {t}")
    assert_close(state, expected_state, 1e-12, "state")


def test_strongly_negative_gates_float32():
    """g around −20 per step (down to −400, and −200 spikes): float32 outputs, final state and
    gradients stay finite and accurate; nothing overflows. (The outputs lose a little precision:
    within a chunk the decays are differences of cumulative sums reaching ~−10⁴.)"""
    q, k, v, g, beta, state = _inputs(100, seed=7, gate_scale=(20.0, 0.02), dtype=jnp.float32)
    g = g.at[:, ::9, 1].set(-200.0)
    expected = numpy_delta_rule(q, k, v, g, beta, 4**-0.5, state)

    def loss(*a):
        out, final = gated_delta_rule(*a, initial_state=state, return_final_state=True)
        return jnp.sum(out) + jnp.sum(final), (out, final)

    grads, values = jax.jit(jax.grad(loss, argnums=tuple(range(5)), has_aux=True))(q, k, v, g, beta)
    assert values[0].dtype == jnp.float32 and values[1].dtype == jnp.float32
    assert_close(values, expected, 1e-4, "values")
    assert all(bool(jnp.all(jnp.isfinite(gr))) for gr in grads)


def test_dtypes_follow_contract():
    """Output in the dtype of q, final state float32 (checked by abstract evaluation)."""
    shapes = ((1, 9, 2, 4), (1, 9, 2, 4), (1, 9, 2, 3), (1, 9, 2), (1, 9, 2))
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
    for impl in ("reference", "xla"):
        out, state = jax.eval_shape(functools.partial(
            gated_delta_rule, return_final_state=True, implementation=impl), *args)
        assert (out.dtype, out.shape) == (jnp.bfloat16, (1, 9, 2, 3))
        assert (state.dtype, state.shape) == (jnp.float32, (1, 2, 4, 3))
    step_args = [jax.ShapeDtypeStruct(s[:1] + s[2:], jnp.bfloat16) for s in shapes]
    out, state = jax.eval_shape(gated_delta_rule_step,
                                jax.ShapeDtypeStruct((1, 2, 4, 3), jnp.float32), *step_args)
    assert (out.dtype, state.dtype) == (jnp.bfloat16, jnp.float32)


def _grad_temp_bytes(T, K, V, chunk_size=64):
    def loss(q, k, v, g, beta):
        return jnp.sum(gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size))

    shapes = ((1, T, 1, K), (1, T, 1, K), (1, T, 1, V), (1, T, 1), (1, T, 1))
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    compiled = jax.jit(jax.grad(loss, argnums=tuple(range(5)))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_is_linear_in_time_and_far_below_per_token_states():
    """Forward + backward of the chunked rung at T=4096: temporaries grow linearly with T and
    stay far below one K×V state per token (T·K·V·4 bytes). The C×C systems of every chunk are
    solved at once (O(T·C) temporaries: 11 % of the per-token states at K = V = 128)."""
    K = V = 128
    small, large = _grad_temp_bytes(1024, K, V), _grad_temp_bytes(4096, K, V)
    assert large < 4.4 * small, (small, large)
    assert large < 0.15 * 4096 * K * V * 4, large


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=np.zeros((2, 5, 2))), r"q must have shape \[B,T,H,K\]"),
        (dict(k=np.zeros((2, 5, 2, 3))), "axis K of k"),
        (dict(v=np.zeros((2, 6, 2, 3))), "axis T of v"),
        (dict(g=np.zeros((2, 5, 3))), "axis H of g"),
        (dict(beta=np.zeros((2, 5, 2, 1))), r"beta must have shape \[B,T,H\]"),
        (dict(initial_state=np.zeros((2, 2, 4, 4))), "axis V of initial_state"),
        (dict(q=np.zeros((2, 5, 2, 4), np.int32)), "q must be a floating-point array"),
        (dict(chunk_size=0), "chunk_size must be a positive int"),
        (dict(implementation="cudnn"), "implementation='cudnn' is not available"),
    ],
)
def test_bad_inputs_are_named(change, message):
    args = dict(q=np.zeros((2, 5, 2, 4)), k=np.zeros((2, 5, 2, 4)), v=np.zeros((2, 5, 2, 3)),
                g=np.zeros((2, 5, 2)), beta=np.zeros((2, 5, 2)))
    args.update(change)
    arrays = {name: jnp.asarray(x) if isinstance(x, np.ndarray) else x
              for name, x in args.items()}
    with pytest.raises(ValueError, match=message):
        gated_delta_rule(**arrays)


def test_bad_step_inputs_are_named():
    state = jnp.zeros((2, 2, 4, 3))
    q, v, g = jnp.zeros((2, 2, 4)), jnp.zeros((2, 2, 3)), jnp.zeros((2, 2))
    with pytest.raises(ValueError, match="axis V of v"):
        gated_delta_rule_step(state, q, q, jnp.zeros((2, 2, 5)), g, g)
    with pytest.raises(ValueError, match=r"g must have shape \[B,H\]"):
        gated_delta_rule_step(state, q, q, v, g[..., None], g)


delta_rule_module = importlib.import_module("hybrid_jax.ops.delta_rule")


@pytest.fixture
def on_gpu(monkeypatch):
    """The backend patched to "gpu": rung choice from shapes only (nothing runs on a GPU)."""
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    monkeypatch.setattr(delta_rule_module, "backend", lambda: "gpu")
    monkeypatch.setattr(pallas_delta_rule, "_platform", lambda: "gpu")
    dispatch._LOGGED.clear()


def _rung(B, T, H, K, V, dtype=jnp.bfloat16, documents=False, initial_state=False,
          implementation=None):
    sds = jax.ShapeDtypeStruct
    args = (sds((B, T, H, K), dtype), sds((B, T, H, K), dtype), sds((B, T, H, V), dtype),
            sds((B, T, H), dtype), sds((B, T, H), dtype))
    kwargs = dict(scale=K**-0.5, chunk_size=64,
                  initial_state=sds((B, H, K, V), jnp.float32) if initial_state else None,
                  starts=sds((B, T), jnp.bool_) if documents else None)
    rung, reasons = dispatch.choose("gated_delta_rule", delta_rule_module._RUNGS, implementation,
                                    *args, **kwargs)
    return rung.name, reasons


@pytest.mark.parametrize("K,V", [(128, 128), (64, 64), (256, 256), (128, 256)])
def test_auto_picks_the_kernel_on_gpu(on_gpu, K, V):
    assert _rung(4, 8192, 16, K, V, documents=True, initial_state=True)[0] == "pallas"
    assert _rung(2, 777, 4, K, V, dtype=jnp.float32)[0] == "pallas"


def test_auto_falls_back_with_the_reason(on_gpu, caplog):
    name, reasons = _rung(2, 64, 4, 96, 128)
    assert name == "xla" and "head dim K=96" in reasons[0]
    q, k, v, g, beta, _ = _inputs(16, K=8, V=8, dtype=jnp.float32)
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        for _ in range(2):  # same shapes: logged once (traced only: the xla rung on the CPU)
            jax.eval_shape(lambda *a: gated_delta_rule(*a), q, k, v, g, beta)
    records = [r for r in caplog.records if r.name == "hybrid_jax.dispatch"]
    assert len(records) == 1 and "pallas: head dim K=8" in records[0].getMessage()


def test_on_a_tpu_the_kernel_runs_only_when_named(monkeypatch):
    """The TPU kernels take the call when `implementation="pallas"` names them (lowered for a
    TPU here: the op reaches the Mosaic kernels); auto keeps the xla rung on a TPU (the kernels
    have run in TPU interpret mode only) and says why."""
    for module in (dispatch, delta_rule_module):
        monkeypatch.setattr(module, "backend", lambda: "tpu")
    monkeypatch.setattr(pallas_delta_rule, "_platform", lambda: "tpu")
    name, reasons = _rung(4, 8192, 16, 128, 128, documents=True, initial_state=True)
    assert name == "xla" and "not chosen automatically on tpu" in reasons[0]
    sds = jax.ShapeDtypeStruct
    B, T, H, K = 2, 100, 2, 64
    args = [sds((B, T, H, K), jnp.bfloat16)] * 3 + [sds((B, T, H), jnp.float32)] * 2
    text = lower_for_tpu(lambda *a: gated_delta_rule(*a, implementation="pallas"), *args)
    assert "gated_delta_rule_tpu_forward" in text


def test_forced_kernel_refuses_unsupported_calls():
    q, k, v, g, beta, _ = _inputs(16, dtype=jnp.float32)
    with pytest.raises(ValueError, match="'pallas' cannot run this call: needs a GPU"):
        gated_delta_rule(q, k, v, g, beta, implementation="pallas")
