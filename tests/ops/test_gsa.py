"""gated_slot_attention and its two chunked passes against a float64 numpy per-token loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops.gsa import (
    gated_slot_attention,
    gated_slot_attention_step,
    gsa_slot_logits,
    gsa_slot_readout,
)
from tests.helpers import assert_close, assert_directional_derivatives, normals


def numpy_gsa(q, k, v, s, g, scale, initial_state=None, *, delay=0, p=None):
    """The recurrence as written in the docstring, one token at a time, in float64.

    The slots read at step t hold the tokens ≤ t − delay. Returns the outputs, the slot logits
    (before the softmax), the readout `Ṽᵀp_t` for given weights p, and the final (K̃, Ṽ).
    """
    q, k, v, s, g = (np.asarray(a, np.float64) for a in (q, k, v, s, g))
    B, T, H, K = q.shape
    M, V = s.shape[-1], v.shape[-1]
    if initial_state is None:
        slot_keys, slot_values = np.zeros((B, H, K, M)), np.zeros((B, H, M, V))
    else:
        slot_keys, slot_values = (np.array(x, np.float64) for x in initial_state)
    out, logits, readout = np.zeros((B, T, H, V)), np.zeros((B, T, H, M)), np.zeros((B, T, H, V))
    for t in range(T):
        j = t - delay
        if j >= 0:
            forget = np.exp(g[:, j])
            slot_keys = slot_keys * forget[:, :, None, :] + k[:, j, :, :, None] * s[:, j, :, None]
            slot_values = forget[..., None] * slot_values + s[:, j, :, :, None] * v[:, j, :, None]
        logits[:, t] = scale * np.einsum("bhkm,bhk->bhm", slot_keys, q[:, t])
        probs = np.exp(logits[:, t] - logits[:, t].max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out[:, t] = np.einsum("bhmv,bhm->bhv", slot_values, probs)
        if p is not None:
            readout[:, t] = np.einsum("bhmv,bhm->bhv", slot_values, np.asarray(p[:, t]))
    return dict(out=out, logits=logits, readout=readout, state=(slot_keys, slot_values))


GATE_SCALES = (0.02, 0.3, 3.0, 20.0)  # per slot: long memory ... g around −20 per step


def _inputs(T, *, B=2, H=2, K=4, V=5, M=4, seed=0, gate_scales=GATE_SCALES,
            dtype=jnp.float64):
    """q, k, v, s in (0, 1), g ≤ 0 with one scale per slot, and an initial (K̃, Ṽ)."""
    q, k, v, s, g, slot_keys, slot_values = (np.asarray(a) for a in normals(
        seed, (B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H, M), (B, T, H, M),
        (B, H, K, M), (B, H, M, V), dtype=dtype))
    s = 1 / (1 + np.exp(-s))
    g = -np.exp(g) * np.resize(np.asarray(gate_scales), M)
    return tuple(jnp.asarray(a, dtype) for a in (q, k, v, s, g)), (
        jnp.asarray(slot_keys, dtype), jnp.asarray(slot_values, dtype))


@functools.partial(jax.jit, static_argnames=("implementation", "chunk_size"))
def _run(q, k, v, s, g, initial_state, *, implementation, chunk_size=64):
    return gated_slot_attention(q, k, v, s, g, initial_state=initial_state, chunk_size=chunk_size,
                                return_final_state=True, implementation=implementation)


def _expected(args, state, **kwargs):
    result = numpy_gsa(*args, 4**-0.5, state, **kwargs)
    return result["out"], result["state"]


@pytest.mark.parametrize("T", [1, 7, 64, 100, 257])
def test_rungs_match_numpy(x64, T):
    args, state = _inputs(T)
    expected = _expected(args, state)
    assert_close(_run(*args, state, implementation="reference"), expected, 1e-12, "reference")
    for chunk_size in (16, 64):
        assert_close(_run(*args, state, implementation="xla", chunk_size=chunk_size),
                     expected, 1e-10, f"xla chunk {chunk_size}")


def test_zero_initial_state_scale_and_small_chunks(x64):
    args, _ = _inputs(21, seed=1)
    expected = numpy_gsa(*args, 0.7)
    for impl, chunk_size in (("reference", 64), ("xla", 1), ("xla", 4)):
        out = jax.jit(functools.partial(gated_slot_attention, scale=0.7, chunk_size=chunk_size,
                                        return_final_state=True, implementation=impl))(*args)
        assert_close(out, (expected["out"], expected["state"]), 1e-10, f"{impl} {chunk_size}")


@pytest.mark.parametrize("T, chunk_size", [(64, 64), (13, 16)])
def test_one_chunk_zero_state_under_jit_float32(T, chunk_size):
    """A sequence in one chunk from the zero state, float32 under jit, at a mixer's sizes: the
    case XLA:CPU's YNNPACK fusion got wrong in jaxlib 0.10 (values near 1e30) until
    `hybrid_jax.xla_flags` left reductions out of it."""
    args, _ = _inputs(T, K=32, V=32, M=64, seed=5, dtype=jnp.float32)
    expected = numpy_gsa(*args, 32**-0.5)["out"]
    out = jax.jit(functools.partial(gated_slot_attention, chunk_size=chunk_size,
                                    implementation="xla"))(*args)
    assert_close(out, expected, 1e-4, f"xla T {T} chunk {chunk_size}")


def test_initial_state_chains(x64):
    """[0:t] then [t:T] from the carried state equals [0:T] in one call."""
    args, state = _inputs(100, seed=2)
    full_out, full_state = _run(*args, state, implementation="xla", chunk_size=64)
    first_out, mid_state = _run(*(x[:, :37] for x in args), state, implementation="xla")
    second_out, end_state = _run(*(x[:, 37:] for x in args), mid_state, implementation="xla")
    assert_close(jnp.concatenate([first_out, second_out], axis=1), full_out, 1e-12, "outputs")
    assert_close(end_state, full_state, 1e-12, "state")


def test_gradients_match_reference_and_numpy(x64):
    """Gradients w.r.t. q, k, v, s, g and both initial states of a loss on outputs and final
    state: xla against reference, and both against central differences of the numpy loop."""
    T = 40
    args, state = _inputs(T, seed=3)
    weights = normals(4, (2, T, 2, 5), (2, 2, 4, 4), (2, 2, 4, 5))

    def loss(impl, q, k, v, s, g, initial_state):
        out, (slot_keys, slot_values) = gated_slot_attention(
            q, k, v, s, g, initial_state=initial_state, chunk_size=16, return_final_state=True,
            implementation=impl)
        return (jnp.sum(weights[0] * out) + jnp.sum(weights[1] * slot_keys)
                + jnp.sum(weights[2] * slot_values))

    grads = {impl: jax.jit(jax.grad(functools.partial(loss, impl), argnums=tuple(range(6))))(
        *args, state) for impl in ("reference", "xla")}
    assert_close(grads["xla"], grads["reference"], 1e-10, "xla vs reference")

    def numpy_loss(*a):
        result = numpy_gsa(*a[:5], 0.5, a[5])
        return (np.sum(weights[0] * result["out"]) + np.sum(weights[1] * result["state"][0])
                + np.sum(weights[2] * result["state"][1]))

    assert_directional_derivatives(grads, numpy_loss, (*args, state), seed=5)


def test_passes_with_delay_match_numpy(x64):
    """The public passes: slot logits before the softmax and the readout for arbitrary slot
    weights, with the slots delayed by w steps (NHA) or not, and their final states."""
    T = 21
    (q, k, v, s, g), (slot_keys, slot_values) = _inputs(T, seed=6)
    p = normals(7, (2, T, 2, 4))

    @jax.jit
    def passes(q, k, v, s, g, p, slot_keys, slot_values):
        return [(gsa_slot_logits(q, k, s, g, initial_state=slot_keys, chunk_size=8, delay=delay,
                                 return_final_state=True),
                 gsa_slot_readout(p, v, s, g, initial_state=slot_values, chunk_size=8,
                                  delay=delay, return_final_state=True))
                for delay in (0, 5, T + 3)]

    results = passes(q, k, v, s, g, p, slot_keys, slot_values)
    for delay, (logits, readout) in zip((0, 5, T + 3), results, strict=True):
        expected = numpy_gsa(q, k, v, s, g, 0.5, (slot_keys, slot_values), delay=delay, p=p)
        assert_close(logits, (expected["logits"], expected["state"][0]), 1e-10, f"logits {delay}")
        assert_close(readout, (expected["readout"], expected["state"][1]), 1e-10,
                     f"readout {delay}")


def test_step_matches_numpy(x64):
    args, state = _inputs(7, seed=8)
    expected = _expected(args, state)
    step = jax.jit(gated_slot_attention_step)
    for t in range(7):
        out, state = step(state, *(x[:, t] for x in args))
        assert_close(out, expected[0][:, t], 1e-12, f"step {t}")
    assert_close(state, expected[1], 1e-12, "state")


def test_strongly_negative_gates_float32():
    """g around −20 per step in every slot (down to −400, and −200 spikes): float32 values and
    gradients stay finite and accurate; nothing overflows."""
    args, state = _inputs(100, seed=9, gate_scales=(20.0,), dtype=jnp.float32)
    args = (*args[:4], args[4].at[:, ::9].set(-200.0))
    expected = _expected(args, state)

    def loss(*a):
        out, final = gated_slot_attention(*a, initial_state=state, return_final_state=True)
        return jnp.sum(out) + sum(jnp.sum(x) for x in final), (out, final)

    grads, values = jax.jit(jax.grad(loss, argnums=tuple(range(5)), has_aux=True))(*args)
    assert values[0].dtype == jnp.float32 and values[1][0].dtype == jnp.float32
    assert_close(values, expected, 1e-4, "values")
    assert all(bool(jnp.all(jnp.isfinite(gr))) for gr in grads)


def test_dtypes_follow_contract():
    """Output in the dtype of q, final states and pass outputs float32 (abstract evaluation)."""
    shapes = ((1, 9, 2, 4), (1, 9, 2, 4), (1, 9, 2, 3), (1, 9, 2, 6), (1, 9, 2, 6))
    args = [jax.ShapeDtypeStruct(x, jnp.bfloat16) for x in shapes]
    for impl in ("reference", "xla"):
        out, (slot_keys, slot_values) = jax.eval_shape(functools.partial(
            gated_slot_attention, return_final_state=True, implementation=impl), *args)
        assert (out.dtype, out.shape) == (jnp.bfloat16, (1, 9, 2, 3))
        assert (slot_keys.dtype, slot_keys.shape) == (jnp.float32, (1, 2, 4, 6))
        assert (slot_values.dtype, slot_values.shape) == (jnp.float32, (1, 2, 6, 3))
    q, k, v, s, g = args
    assert jax.eval_shape(gsa_slot_logits, q, k, s, g).dtype == jnp.float32
    assert jax.eval_shape(gsa_slot_readout, s, v, s, g).dtype == jnp.float32
    step_args = [jax.ShapeDtypeStruct(x[:1] + x[2:], jnp.bfloat16) for x in shapes]
    state = (jax.ShapeDtypeStruct((1, 2, 4, 6), jnp.float32),
             jax.ShapeDtypeStruct((1, 2, 6, 3), jnp.float32))
    out, new_state = jax.eval_shape(gated_slot_attention_step, state, *step_args)
    assert (out.dtype, new_state[0].dtype, new_state[1].dtype) == (
        jnp.bfloat16, jnp.float32, jnp.float32)


def _grad_temp_bytes(T, K, V, M):
    def loss(q, k, v, s, g):
        return jnp.sum(gated_slot_attention(q, k, v, s, g, implementation="xla"))

    shapes = ((1, T, 1, K), (1, T, 1, K), (1, T, 1, V), (1, T, 1, M), (1, T, 1, M))
    args = [jax.ShapeDtypeStruct(x, jnp.float32) for x in shapes]
    compiled = jax.jit(jax.grad(loss, argnums=tuple(range(5)))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_is_linear_in_time_and_far_below_per_token_states():
    """Forward + backward of the chunked rung at T=4096: temporaries grow linearly with T and
    stay far below one K×M slot-key state per token (T·K·M·4 bytes)."""
    K = V = 128
    M = 64
    small, large = _grad_temp_bytes(1024, K, V, M), _grad_temp_bytes(4096, K, V, M)
    assert large < 4.4 * small, (small, large)
    assert large < 0.25 * 4096 * K * M * 4, large


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=np.zeros((2, 5, 2))), r"q must have shape \[B,T,H,K\]"),
        (dict(k=np.zeros((2, 5, 2, 3))), "axis K of k"),
        (dict(v=np.zeros((2, 6, 2, 3))), "axis T of v"),
        (dict(g=np.zeros((2, 5, 2, 7))), "axis M of g"),
        (dict(s=np.zeros((2, 5, 3, 6))), "axis H of s"),
        (dict(initial_state=(np.zeros((2, 2, 4, 6)), np.zeros((2, 2, 6, 4)))),
         "axis V of slot_values"),
        (dict(initial_state=(np.zeros((2, 2, 4, 5)), np.zeros((2, 2, 6, 3)))),
         "axis M of slot_keys"),
        (dict(initial_state=np.zeros((2, 2, 4, 6))), "slot state must be a pair"),
        (dict(s=np.zeros((2, 5, 2, 6), np.int32)), "s must be a floating-point array"),
        (dict(chunk_size=24), "chunk_size must be a power of two"),
        (dict(implementation="cudnn"), "implementation='cudnn' is not available"),
        (dict(implementation="pallas"), "implementation='pallas' cannot run this call"),
    ],
)
def test_bad_inputs_are_named(change, message):
    args = dict(q=np.zeros((2, 5, 2, 4)), k=np.zeros((2, 5, 2, 4)), v=np.zeros((2, 5, 2, 3)),
                s=np.zeros((2, 5, 2, 6)), g=np.zeros((2, 5, 2, 6)))
    args.update(change)
    arrays = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, args)
    with pytest.raises(ValueError, match=message):
        gated_slot_attention(**arrays)


def test_bad_pass_and_step_inputs_are_named():
    q, s = jnp.zeros((2, 5, 2, 4)), jnp.zeros((2, 5, 2, 6))
    with pytest.raises(ValueError, match="delay must be an int >= 0"):
        gsa_slot_logits(q, q, s, s, delay=-1)
    with pytest.raises(ValueError, match="axis M of initial_state"):
        gsa_slot_logits(q, q, s, s, initial_state=jnp.zeros((2, 2, 4, 5)))
    with pytest.raises(ValueError, match="axis V of initial_state"):
        gsa_slot_readout(s, q, s, s, initial_state=jnp.zeros((2, 2, 6, 5)))
    state = (jnp.zeros((2, 2, 4, 6)), jnp.zeros((2, 2, 6, 3)))
    with pytest.raises(ValueError, match="axis V of v"):
        gated_slot_attention_step(state, q[:, 0], q[:, 0], q[:, 0], s[:, 0], s[:, 0])
    with pytest.raises(ValueError, match="state is required"):
        gated_slot_attention_step(None, q[:, 0], q[:, 0], q[:, 0], s[:, 0], s[:, 0])
