"""native_hybrid_attention (reference, chunked xla, decode step) against a float64 numpy loop."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops import dispatch
from hybrid_jax.ops import nha as nha_ops
from hybrid_jax.ops.attention import attention
from hybrid_jax.ops.gsa import gated_slot_attention
from hybrid_jax.ops.nha import (
    NHAState,
    native_hybrid_attention,
    native_hybrid_attention_step,
    nha_chunk_states,
    nha_empty_state,
    nha_slot_stream,
)
from hybrid_jax.ops.segments import RESET_LOG_DECAY
from tests.helpers import assert_close, assert_directional_derivatives, normals

attention_module = importlib.import_module("hybrid_jax.ops.attention")  # not ops.attention()

C = 16  # chunk size of the xla rung in these tests


def numpy_nha(q, k, v, s, g, window, scale, q_window=None, k_window=None, segment_ids=None,
              state=None, empty_slots="mask"):
    """The equations, one query at a time, by absolute token position p, in float64.

    At position P the slots hold the tokens p ≤ P − w (a document start empties them before it
    writes), the window the tokens max(P − w + 1, start of P's document) .. P. Returns the
    outputs and the final (slot keys, slot values, document starts).
    """
    q, k, v, s, g = (np.asarray(a, np.float64) for a in (q, k, v, s, g))
    q_window = q if q_window is None else np.asarray(q_window, np.float64)
    k_window = k if k_window is None else np.asarray(k_window, np.float64)
    B, T, H, K = q.shape
    G, M, V = k.shape[2], s.shape[-1], v.shape[-1]
    w = window
    length = 0 if state is None else int(state.length)
    doc_starts = np.zeros(B, int) if state is None else np.array(state.document_start)
    if state is None:
        slot_keys, slot_values = np.zeros((B, G, K, M)), np.zeros((B, G, M, V))
    else:
        slot_keys, slot_values = (np.array(x, np.float64) for x in state[:2])
    out = np.zeros((B, T, H, V))
    for b in range(B):
        tokens = {}  # position -> (k, v, s, g, k_window), each [G, .]
        if state is not None:
            for p in range(max(length - w, 0), length):
                tokens[p] = tuple(np.asarray(x, np.float64)[b, p % w] for x in state[2:7])
        for t in range(T):
            tokens[length + t] = (k[b, t], v[b, t], s[b, t], g[b, t], k_window[b, t])
        starts = {doc_starts[b]}
        if segment_ids is not None:
            starts |= {length + t for t in range(1, T)
                       if segment_ids[b, t] != segment_ids[b, t - 1]}
        next_in = length - w  # the tokens before it are in the initial slots already
        start = doc_starts[b]
        for t in range(T):
            P = length + t
            if P in starts:
                start = P
            while next_in <= P - w:
                if next_in in tokens:
                    kk, vv, ss, gg, _ = tokens[next_in]
                    if next_in in starts:
                        slot_keys[b] = 0.0
                        slot_values[b] = 0.0
                    else:
                        slot_keys[b] *= np.exp(gg)[:, None, :]
                        slot_values[b] *= np.exp(gg)[:, :, None]
                    slot_keys[b] += kk[:, :, None] * ss[:, None, :]
                    slot_values[b] += ss[:, :, None] * vv[:, None, :]
                next_in += 1
            keys = range(max(P - w + 1, start), P + 1)
            for h in range(H):
                kv = h * G // H
                logits = [scale * q_window[b, t, h] @ tokens[p][4][kv] for p in keys]
                values = [tokens[p][1][kv] for p in keys]
                if P - w >= start:
                    logits = list(scale * slot_keys[b, kv].T @ q[b, t, h]) + logits
                    values = list(slot_values[b, kv]) + values
                elif empty_slots == "sink":
                    logits = [0.0] * M + logits
                    values = [np.zeros(V)] * M + values
                probs = np.exp(np.array(logits) - max(logits))
                out[b, t, h] = (probs / probs.sum()) @ np.array(values)
        doc_starts[b] = start
    return out, (slot_keys, slot_values, doc_starts)


def _inputs(T, *, B=2, H=2, G=1, K=3, V=4, M=3, D=5, seed=0, dtype=jnp.float64):
    """q, k, v, s, g (g ≤ 0 from mild to strong forgetting, s = 1 − e^g), q_window, k_window."""
    rng = np.random.default_rng(seed)  # numpy float64 draws (normals' draws, without jax)
    q, k, v, f, q_window, k_window = (rng.standard_normal(shape) for shape in (
        (B, T, H, K), (B, T, G, K), (B, T, G, V), (B, T, G, M), (B, T, H, D), (B, T, G, D)))
    g = -np.exp(np.asarray(f)) * np.resize([0.05, 0.5, 3.0], M)
    arrays = (q, k, v, 1 - np.exp(g), g, q_window, k_window)
    return tuple(jnp.asarray(a, dtype) for a in arrays)


def _random_state(seed, *, B=2, G=1, K=3, V=4, M=3, D=5, window=4, length=11):
    """A state after `length` tokens; the document of batch row 1 started at length − 2. As
    the contract says, ring entries of positions < 0 are zeros and a document start in the ring
    carries the reset gate."""
    slot_keys, slot_values, *ring = (np.array(x) for x in normals(
        seed, (B, G, K, M), (B, G, M, V), (B, window, G, K), (B, window, G, V),
        (B, window, G, M), (B, window, G, M), (B, window, G, D)))
    ring[2], ring[3] = 1 / (1 + np.exp(-ring[2])), -np.abs(ring[3])
    starts = np.array([0, length - 2])
    positions = length - window + np.arange(window)  # of the ring, oldest first
    for x in ring:
        x[:, positions < 0] = 0.0
    ring[3][positions[None, :] == starts[:, None]] = RESET_LOG_DECAY
    by_index = np.argsort(positions % max(window, 1))  # token p at index p % window
    return NHAState(slot_keys, slot_values, *(x[:, by_index] for x in ring),
                    jnp.asarray(length, jnp.int32), jnp.asarray(starts, jnp.int32))


@functools.partial(jax.jit, static_argnames=("window", "implementation", "empty_slots"))
def _run(q, k, v, s, g, q_window, k_window, segment_ids=None, state=None, *, window,
         implementation, empty_slots="mask"):
    return native_hybrid_attention(
        q, k, v, s, g, window=window, q_window=q_window, k_window=k_window,
        segment_ids=segment_ids, initial_state=state, return_final_state=True,
        empty_slots=empty_slots, chunk_size=C, implementation=implementation)


def _check_against_numpy(args, window, *, segment_ids=None, state=None, empty_slots="mask",
                         rungs=("reference", "xla")):
    expected, (slot_keys, slot_values, starts) = numpy_nha(
        *args[:5], window, 3**-0.5, *args[5:], segment_ids=segment_ids, state=state,
        empty_slots=empty_slots)
    for impl in rungs:
        out, final = _run(*args, segment_ids, state, window=window, implementation=impl,
                          empty_slots=empty_slots)
        what = f"{impl} window={window} T={args[0].shape[1]}"
        assert_close(out, expected, 1e-6, what)
        assert_close((final.slot_keys, final.slot_values), (slot_keys, slot_values), 1e-6, what)
        np.testing.assert_array_equal(final.document_start, starts)
        assert int(final.length) == args[0].shape[1] + (0 if state is None else int(state.length))


WINDOWS = (0, 1, 3, C - 1, C, C + 1, 2 * C + 3)  # then T and T + 9


@pytest.mark.parametrize("T, window", [(5, 3), (64, C), (129, C + 1), (129, 2 * C + 3)])
def test_xla_matches_numpy(x64, T, window):
    """A representative subset (bands of 1 to 4 key chunks, T not a multiple of C; windows of
    0 and >= T are in the GSA / attention test); the full product of windows and lengths for
    both rungs is `test_every_window_and_length` (slow)."""
    _check_against_numpy(_inputs(T, H=4, G=2, seed=T), window, rungs=("xla",))


@pytest.mark.slow
@pytest.mark.parametrize("T", [1, 5, 64, 129])
def test_every_window_and_length(x64, T):
    args = _inputs(T, H=4, G=2, seed=T)
    for window in sorted(set(WINDOWS) | {T, T + 9}):
        _check_against_numpy(args, window)


def test_packed_documents_initial_state_and_sinks_match_numpy(x64):
    """Segment ids (documents of 1 to 20 tokens), a random initial state whose current
    document starts inside the ring in one batch row, and zero-value sinks; both rungs."""
    T = 40
    args = _inputs(T, seed=1)
    segment_ids = jnp.asarray(np.cumsum(np.random.default_rng(2).random((2, T)) < 0.15, axis=1))
    _check_against_numpy(args, C + 1, segment_ids=segment_ids, state=_random_state(3, window=C + 1))
    _check_against_numpy(args, 0, segment_ids=segment_ids, state=_random_state(3, window=0),
                         rungs=("xla",))
    _check_against_numpy(args, 2, segment_ids=segment_ids, empty_slots="sink", rungs=("xla",))


def test_window_zero_is_gsa_and_full_window_is_causal_attention(x64):
    T = 45
    q, k, v, s, g, q_window, k_window = _inputs(T, H=4, G=2, seed=4)
    segment_ids = jnp.asarray([[0] * 20 + [1] * 25, [0] * 45])
    repeat = functools.partial(jnp.repeat, repeats=2, axis=2)
    run = jax.jit(functools.partial(native_hybrid_attention, chunk_size=C),
                  static_argnames=("window", "implementation"))
    expected = gated_slot_attention(q, *map(repeat, (k, v, s, g)), scale=3**-0.5)
    assert_close(run(q, k, v, s, g, window=0), expected, 1e-10, "window 0")
    expected = attention(q_window, k_window, v, scale=3**-0.5, segment_ids=segment_ids)
    for window, impl in ((T, "xla"), (T + 9, "reference"), (T, "attention")):
        out = run(q, k, v, s, g, window=window, q_window=q_window, k_window=k_window,
                  segment_ids=segment_ids, implementation=impl)
        assert_close(out, expected, 1e-10, f"{impl} window {window}")


def test_attention_rung_takes_idle_slots_only(x64, monkeypatch):
    """The "attention" rung (idle slots, empty ones masked: causal attention of the window
    branch) against the reference, values and gradients of every input with packed documents
    and the final state; refused by name otherwise; it hands `ops.attention` the window
    branch's own dtype (bf16 for the GPU's kernels), not the op's float32 compute dtype. Row 0's
    id 0 comes back at 14: a new document, as for the slots (`ops.attention` alone would join
    it to the first)."""
    T = 21
    args = _inputs(T, H=4, G=2, seed=5)
    segment_ids = jnp.asarray([[0] * 6 + [1] * 8 + [0] * 7, [0] * 20 + [1]])
    weights = normals(3, (2, T, 4, 4), (2, 2, 3, 3), (2, 2, 3, 4))

    def loss(impl, args, window=T):
        out, final = native_hybrid_attention(
            *args[:5], window=window, q_window=args[5], k_window=args[6],
            segment_ids=segment_ids, return_final_state=True, chunk_size=C,
            implementation=impl)
        return (jnp.sum(weights[0] * out) + jnp.sum(weights[1] * final.slot_keys)
                + jnp.sum(weights[2] * final.slot_values))

    grads = {impl: jax.jit(jax.value_and_grad(functools.partial(loss, impl)))(args)
             for impl in ("attention", "reference")}
    assert_close(grads["attention"], grads["reference"], 1e-10, "attention vs reference")
    used = (grads["reference"][1][i] for i in (2, 5, 6))  # v, q_window, k_window
    assert all(np.linalg.norm(d) > 1e-3 for d in used)
    with pytest.raises(ValueError, match="attention.*cannot run this call: the slots take part"):
        loss("attention", args, window=T - 1)
    with pytest.raises(ValueError, match="zero-value sinks"):
        native_hybrid_attention(*args[:5], window=T, implementation="attention",
                                empty_slots="sink")
    dtypes = []

    def spy(q, k, v, **kwargs):
        dtypes.append((q.dtype, k.dtype, v.dtype))
        return attention(q, k, v, **kwargs)

    monkeypatch.setattr(nha_ops, "attention", spy)
    bf16 = [x.astype(jnp.bfloat16 if i in (2, 5, 6) else jnp.float32)
            for i, x in enumerate(args)]
    out = native_hybrid_attention(*bf16[:5], window=T, q_window=bf16[5], k_window=bf16[6],
                                  segment_ids=segment_ids, implementation="attention")
    assert dtypes == [(jnp.bfloat16,) * 3] and out.dtype == jnp.float32


def test_auto_takes_the_attention_rung_for_idle_slots_on_an_accelerator(monkeypatch):
    """On a GPU (backend patched; traced only), auto runs idle, masked slots as causal attention
    where `ops.attention` takes a kernel (bf16); float32 there would be its [T, T] XLA rung, so
    auto passes over it and says why; calls whose slots take part, and CPUs, never hear of it."""
    chosen = []

    def choose_only(op, rungs, implementation, *args, **kwargs):
        rung, reasons = dispatch.choose(op, rungs, implementation, *args, **kwargs)
        chosen.append((rung.name, [r for r in reasons if r.startswith("attention")]))
        return nha_ops.nha_xla(*args, **kwargs)

    monkeypatch.setattr(nha_ops, "dispatch", choose_only)

    def rung(platform, T, window, dtype):
        for module in (dispatch, nha_ops, attention_module):
            monkeypatch.setattr(module, "backend", lambda: platform)
        args = [jax.ShapeDtypeStruct(x.shape, jnp.float32 if i == 4 else dtype)
                for i, x in enumerate(_inputs(T, H=4, G=2, K=64, V=64, D=64, dtype=jnp.float32))]
        jax.eval_shape(functools.partial(native_hybrid_attention, window=window),
                       *args[:5], q_window=args[5], k_window=args[6],
                       segment_ids=jax.ShapeDtypeStruct((2, T), jnp.int32))
        return chosen.pop()

    assert rung("gpu", 256, 256, jnp.bfloat16) == ("attention", [])
    assert rung("gpu", 256, 1000, jnp.bfloat16) == ("attention", [])
    assert rung("gpu", 256, 255, jnp.bfloat16)[1] == []  # the slots take part: no word
    name, reasons = rung("gpu", 256, 256, jnp.float32)
    assert name != "attention" and len(reasons) == 1 and "would run its XLA rung" in reasons[0]
    assert rung("cpu", 256, 256, jnp.bfloat16) == ("xla", [])


@pytest.mark.parametrize("window", [7, pytest.param(0, marks=pytest.mark.slow),
                                    pytest.param(50, marks=pytest.mark.slow)])
def test_chaining_and_decode_steps_continue_the_sequence(x64, window):
    """[0:t] then [t:T] from the carried state, and prefill then token-by-token steps, both
    equal [0:T] in one call (the ring is partly filled at t, then wraps; tokens move into the
    slots)."""
    T, split = 41, 5
    args = _inputs(T, H=4, G=2, seed=5)
    full, full_state = _run(*args, window=window, implementation="xla")
    first, state = _run(*(x[:, :split] for x in args), window=window, implementation="xla")
    second, end_state = _run(*(x[:, split:] for x in args), None, state, window=window,
                             implementation="xla")
    assert_close(jnp.concatenate([first, second], axis=1), full, 1e-10, "chained outputs")
    assert_close(end_state, full_state, 1e-10, "chained state")

    @jax.jit
    def decode(state, args):
        def step(state, xs):
            q, k, v, s, g, q_window, k_window = xs
            out, state = native_hybrid_attention_step(state, q, k, v, s, g, q_window=q_window,
                                                      k_window=k_window)
            return state, out

        state, outs = jax.lax.scan(step, state, [jnp.moveaxis(x, 1, 0) for x in args])
        return jnp.moveaxis(outs, 0, 1), state

    stepped, step_state = decode(state, [x[:, split:] for x in args])
    assert_close(stepped, full[:, split:], 1e-10, "steps after prefill")
    assert_close(step_state, full_state, 1e-10, "state after steps")
    empty = nha_empty_state(2, 2, 3, 4, 3, window, window_key_dim=5, dtype=jnp.float64)
    assert_close(decode(empty, args)[0], full, 1e-10, "steps from empty")


def test_step_with_sinks_and_document_start_matches_numpy(x64):
    window, T = 4, 9
    args = _inputs(T, seed=6)
    state = _random_state(7, window=window)
    expected, _ = numpy_nha(*args[:5], window, 3**-0.5, *args[5:], state=state,
                            empty_slots="sink")
    step = jax.jit(functools.partial(native_hybrid_attention_step, empty_slots="sink"))
    for t in range(T):
        q, k, v, s, g, q_window, k_window = (x[:, t] for x in args)
        out, state = step(state, q, k, v, s, g, q_window=q_window, k_window=k_window)
        assert_close(out, expected[:, t], 1e-10, f"step {t}")


@pytest.mark.parametrize("window", [2 * C + 3, *(pytest.param(w, marks=pytest.mark.slow)
                                                 for w in (0, 5, C + 1, 49))])
def test_gradients_match_numpy_and_reference(x64, window):
    """Gradients w.r.t. q, k, v, s, g, q_window, k_window and the initial slots, through the
    outputs and the final slots: xla against reference, and both against central differences
    of the numpy loop along a random direction (GQA, packed documents, an initial state)."""
    T = 40
    args = _inputs(T, H=4, G=2, seed=8)
    segment_ids = jnp.asarray([[0] * 9 + [1] * 31, [0] * 23 + [1] * 17])
    weights = normals(9, (2, T, 4, 4), (2, 2, 3, 3), (2, 2, 3, 4))
    # Row 0's document starts before the ring (length > window), so its initial slots reach
    # the outputs and their gradient is not the ~1e-53 of a reset.
    base = _random_state(10, G=2, window=window, length=max(11, window + 3))

    def loss(impl, args, slots):
        state = base._replace(slot_keys=slots[0], slot_values=slots[1])
        out, final = native_hybrid_attention(
            *args[:5], window=window, q_window=args[5], k_window=args[6],
            segment_ids=segment_ids, initial_state=state, return_final_state=True,
            chunk_size=C, implementation=impl)
        return (jnp.sum(weights[0] * out) + jnp.sum(weights[1] * final.slot_keys)
                + jnp.sum(weights[2] * final.slot_values))

    point = (args, tuple(base[:2]))
    grads = {impl: jax.jit(jax.grad(functools.partial(loss, impl), argnums=(0, 1)))(*point)
             for impl in ("reference", "xla")}
    assert_close(grads["xla"], grads["reference"], 1e-10, "xla vs reference")
    assert all(np.linalg.norm(d) > 1e-3 for d in grads["reference"][1]), "initial slots unused"

    def numpy_loss(args, slots):
        state = base._replace(slot_keys=slots[0], slot_values=slots[1])
        out, (slot_keys, slot_values, _) = numpy_nha(
            *args[:5], window, 3**-0.5, *args[5:], segment_ids=segment_ids, state=state)
        return (np.sum(weights[0] * out) + np.sum(weights[1] * slot_keys)
                + np.sum(weights[2] * slot_values))

    assert_directional_derivatives(grads, numpy_loss, point, seed=11)


def test_slot_stream_and_chunk_states(x64):
    """The kernel building blocks: the shifted slot inputs and the slot states entering each
    chunk equal the numpy slots after the tokens ≤ c·C − 1 − w."""
    T, window = 50, 5
    q, k, v, s, g, _, _ = _inputs(T, seed=12)
    stream = jax.jit(functools.partial(nha_slot_stream, window=window))(k, v, s, g)
    np.testing.assert_array_equal(stream.k[:, window:], k[:, :-window])
    np.testing.assert_array_equal(stream.k[:, :window], 0.0)
    np.testing.assert_array_equal(stream.slots_visible, np.tile(np.arange(T) >= window, (2, 1)))
    keys, values = jax.jit(functools.partial(nha_chunk_states, chunk_size=C))(
        stream.k, stream.v, stream.s, stream.g)
    assert keys.shape == (2, 4, 1, 3, 3) and values.shape == (2, 4, 1, 3, 4)
    for chunk in range(1, 4):
        prefix = [x[:, :chunk * C] for x in (q, k, v, s, g)]
        _, (slot_keys, slot_values, _) = numpy_nha(*prefix, window, 1.0)
        assert_close((keys[:, chunk], values[:, chunk]), (slot_keys, slot_values), 1e-10,
                     f"chunk {chunk}")


def test_strongly_negative_gates_float32():
    """g down to −200 with resets and float32 inputs: finite values and gradients, close to the
    float64 numpy loop."""
    T = 70
    args = _inputs(T, seed=13, dtype=jnp.float32)
    args = (*args[:4], args[4].at[:, ::9].set(-200.0), *args[5:])
    segment_ids = jnp.asarray([[0] * 30 + [1] * 40] * 2)
    expected, _ = numpy_nha(*args[:5], C + 3, 3**-0.5, *args[5:], segment_ids=segment_ids)

    def loss(*a):
        out = native_hybrid_attention(*a[:5], window=C + 3, q_window=a[5], k_window=a[6],
                                      segment_ids=segment_ids, chunk_size=C)
        return jnp.sum(out), out

    grads, out = jax.jit(jax.grad(loss, argnums=tuple(range(7)), has_aux=True))(*args)
    assert out.dtype == jnp.float32
    assert_close(out, expected, 1e-4, "values")
    assert all(bool(jnp.all(jnp.isfinite(gr))) for gr in grads)


def test_dtypes_follow_contract():
    """bfloat16 inputs: output bfloat16, final slots float32; the step keeps the state's dtypes."""
    shapes = ((1, 9, 2, 4), (1, 9, 1, 4), (1, 9, 1, 3), (1, 9, 1, 6), (1, 9, 1, 6))
    args = [jax.ShapeDtypeStruct(x, jnp.bfloat16) for x in shapes]
    for impl in ("reference", "xla"):
        out, state = jax.eval_shape(functools.partial(
            native_hybrid_attention, window=4, return_final_state=True, implementation=impl),
            *args)
        assert (out.dtype, out.shape) == (jnp.bfloat16, (1, 9, 2, 3))
        assert state.slot_keys.dtype == jnp.float32 and state.keys.shape == (1, 4, 1, 4)
    empty = nha_empty_state(1, 1, 4, 3, 6, 4, ring_dtype=jnp.bfloat16)
    step_args = [jax.ShapeDtypeStruct(x[:1] + x[2:], jnp.bfloat16) for x in shapes]
    out, state = jax.eval_shape(native_hybrid_attention_step, empty, *step_args)
    assert out.dtype == jnp.bfloat16
    assert jax.tree.map(lambda x: x.dtype, state) == jax.tree.map(lambda x: x.dtype, empty)


def _grad_temp_bytes(T, window):
    K = V = 128
    M = 64

    def loss(q, k, v, s, g):
        return jnp.sum(native_hybrid_attention(q, k, v, s, g, window=window,
                                               implementation="xla"))

    shapes = ((1, T, 1, K), (1, T, 1, K), (1, T, 1, V), (1, T, 1, M), (1, T, 1, M))
    args = [jax.ShapeDtypeStruct(x, jnp.float32) for x in shapes]
    compiled = jax.jit(jax.grad(loss, argnums=tuple(range(5)))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_is_linear_in_time():
    """Forward + backward of the chunked rung at T = 2048, 4096, 8192 with window 100 (a band
    of 3 key chunks of 64): temporaries grow linearly with T (about 13 kB per token) and stay
    below a K×M slot-key state per token (T·K·M·4 bytes) or one T×T score matrix (T²·4 bytes)."""
    sizes = [_grad_temp_bytes(T, 100) for T in (2048, 4096, 8192)]
    assert sizes[1] < 2.2 * sizes[0] and sizes[2] < 2.2 * sizes[1], sizes
    assert sizes[2] < 0.5 * 8192 * 128 * 64 * 4 and sizes[2] < 0.5 * 8192**2 * 4, sizes


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=np.zeros((2, 5, 2))), r"q must have shape \[B,T,H,K\]"),
        (dict(k=np.zeros((2, 5, 2, 3))), "axis K of k"),
        (dict(k=np.zeros((2, 5, 3, 4)), v=np.zeros((2, 5, 3, 3)), s=np.zeros((2, 5, 3, 6)),
              g=np.zeros((2, 5, 3, 6))), "num_kv_heads .* must divide num_heads"),
        (dict(v=np.zeros((2, 6, 2, 3))), "axis T of v"),
        (dict(g=np.zeros((2, 5, 2, 7))), "axis M of g"),
        (dict(k_window=np.zeros((2, 5, 2, 5))), "axis D of k_window"),
        (dict(s=np.zeros((2, 5, 2, 6), np.int32)), "s must be a floating-point array"),
        (dict(window=-1), "window must be an int >= 0"),
        (dict(empty_slots="zero"), "empty_slots='zero' is not one of"),
        (dict(chunk_size=24), "chunk_size must be a power of two"),
        (dict(segment_ids=np.zeros((2, 4), np.int32)), "axis T of segment_ids"),
        (dict(segment_ids=np.zeros((2, 5))), "segment_ids must be integers"),
        (dict(initial_state=nha_empty_state(2, 2, 4, 3, 6, 5)), "ring holds 5 tokens, window=3"),
        (dict(initial_state=nha_empty_state(2, 2, 4, 4, 6, 3)), "axis V of slot_values"),
        (dict(initial_state=(np.zeros((2, 2, 4, 6)), np.zeros((2, 2, 6, 3)))),
         "must be an NHAState"),
        (dict(implementation="pallas"), "implementation='pallas' cannot run this call"),
    ],
)
def test_bad_inputs_are_named(change, message):
    args = dict(q=np.zeros((2, 5, 2, 4)), k=np.zeros((2, 5, 2, 4)), v=np.zeros((2, 5, 2, 3)),
                s=np.zeros((2, 5, 2, 6)), g=np.zeros((2, 5, 2, 6)), window=3)
    args.update(change)
    arrays = {name: x for name, x in args.items() if isinstance(x, np.ndarray | NHAState)}
    options = {name: x for name, x in args.items() if name not in arrays}
    with pytest.raises(ValueError, match=message):  # raised while tracing: nothing compiles
        jax.eval_shape(functools.partial(native_hybrid_attention, **options), **arrays)


def _empty_with(**fields):
    return nha_empty_state(2, 1, 4, 3, 6, 3)._replace(**fields)


@pytest.mark.parametrize("state, message", [
    # the new state takes these dtypes: the slots and ring would round what they store
    (lambda: _empty_with(slot_keys=jnp.zeros((2, 1, 4, 6), jnp.int32)),
     "slot_keys must be a floating-point array, got dtype int32"),
    (lambda: _empty_with(keys=jnp.zeros((2, 3, 1, 4), jnp.int32)),
     "keys must be a floating-point array, got dtype int32"),
    (lambda: _empty_with(length=jnp.float32(0)), "length must be integers, got dtype float32"),
    (lambda: _empty_with(document_start=jnp.zeros((2,))),
     "document_start must be integers, got dtype float32"),
    # sizes nha_empty_state cannot build (a negative window failed in broadcast_in_dim)
    (lambda: nha_empty_state(2, 1, 4, 3, 6, -1), "nha_empty_state: window must be an int >= 0"),
    (lambda: nha_empty_state(2, 1, 4, 3, 0, 3), "nha_empty_state: num_slots must be an int >= 1"),
    (lambda: nha_empty_state(2, 1, 4.0, 3, 6, 3), "key_dim must be an int >= 1, got 4.0"),
])
def test_states_that_would_round_or_cannot_exist_are_refused(state, message):
    q, k, v, s = (jnp.zeros(shape) for shape in ((2, 2, 4), (2, 1, 4), (2, 1, 3), (2, 1, 6)))
    with pytest.raises(ValueError, match=message):
        native_hybrid_attention_step(state(), q, k, v, s, s)


def test_bad_step_inputs_are_named():
    state = nha_empty_state(2, 1, 4, 3, 6, 3)
    q, v, s = jnp.zeros((2, 2, 4)), jnp.zeros((2, 1, 3)), jnp.zeros((2, 1, 6))
    k = jnp.zeros((2, 1, 4))
    with pytest.raises(ValueError, match="state must be an NHAState"):
        native_hybrid_attention_step(tuple(state), q, k, v, s, s)
    with pytest.raises(ValueError, match="axis V of slot_values"):
        native_hybrid_attention_step(state, q, k, s, s, s)
    with pytest.raises(ValueError, match="axis K of keys"):
        native_hybrid_attention_step(state._replace(keys=jnp.zeros((2, 3, 1, 5))), q, k, v, s, s)
