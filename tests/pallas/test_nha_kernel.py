"""NHA Pallas kernels (GPU and TPU versions, interpret mode on CPU) against float64 references.

Plain calls (the kernel API): values against a numpy per-token loop of the equations
(DESIGN.md, system 1) written here; gradients of every input against `jax.grad` of
`reference.nha_reference` (a per-token `lax.scan`) in float64, itself checked against the
numpy loop. Packed documents, initial and final states (through the ops' pallas rungs, the
kernels in interpret mode): values and final slots against the numpy loop of
`tests/ops/test_nha.py`, gradients of every input and of the initial state against the op's
float64 reference rung; GSA's pallas rung (the kernels at w = 0) against GSA's reference.
Tiny tiles (chunk 8) so that small T spans several chunks and key blocks, with document
boundaries on and off them. Interpret mode compiles slowly on CPU: the default run checks one
plain GPU configuration, two with documents + state + GQA (w = 5; w = 16, a ring of two
chunks, on the split backward kernels), GSA's rung (values and gradients) and TPU
configurations by value (plain, documents + state + GQA, GSA); `pytest -m slow` runs the rest
(every window case, the shifted slot inputs with documents, sinks, states at w = 0, at rings
of two and three chunks and at w > T, head dim 256, strong gates, 16-bit precisions, TPU
gradients).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_kernels.flash_attention.bounds import document_extents
from pallas_kernels.nha import api, chunk_math
from pallas_kernels.nha.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.nha.reference import nha_reference
from tests.helpers import assert_close, normals
from tests.ops import test_nha as op_tests

TINY = BlockSizes(chunk=8, sub_chunk=8, block_q=8, block_k=8, block_q_dkv=8, block_k_dkv=8,
                  state_block=8)
NAMES = ("q", "k", "v", "s", "g", "q_window", "k_window")


def make_inputs(seed, batch, length, heads, kv_heads, key_dim=8, value_dim=8, slots=4,
                window_dim=8, gate_scale=0.5):
    q, k, v, f, qw, kw = normals(
        seed, (batch, length, heads, key_dim), (batch, length, kv_heads, key_dim),
        (batch, length, kv_heads, value_dim), (batch, length, kv_heads, slots),
        (batch, length, heads, window_dim), (batch, length, kv_heads, window_dim),
        dtype=np.float32)
    g = jax.nn.log_sigmoid(2.0 * f) * gate_scale  # decays e^g in (0, 1), some strong
    return dict(q=q, k=k, v=v, s=1.0 - jnp.exp(g), g=g, q_window=qw, k_window=kw)


def numpy_nha(x, window, scale, empty_slots):
    """Per-token float64 loop of the definition: token t − w enters the slots at step t, then
    one softmax over the slot logits and the window t−w+1..t."""
    q, k, v, s, g, qw, kw = (np.asarray(x[n], np.float64) for n in NAMES)
    batch, length, heads, _ = q.shape
    group = heads // k.shape[2]
    out = np.zeros((batch, length, heads, v.shape[3]))
    for b in range(batch):
        for h in range(heads):
            kv = h // group
            slot_keys = np.zeros((k.shape[3], s.shape[3]))
            slot_values = np.zeros((s.shape[3], v.shape[3]))
            for t in range(length):
                j = t - window
                if j >= 0:
                    decay = np.exp(g[b, j, kv])
                    slot_keys = slot_keys * decay + np.outer(k[b, j, kv], s[b, j, kv])
                    slot_values = decay[:, None] * slot_values + np.outer(s[b, j, kv], v[b, j, kv])
                keys = range(max(0, t - window + 1), t + 1)
                logits = [scale * qw[b, t, h] @ kw[b, i, kv] for i in keys]
                values = [v[b, i, kv] for i in keys]
                if j >= 0 or empty_slots == "sink":
                    logits = list(scale * q[b, t, h] @ slot_keys) + logits
                    values = list(slot_values) + values
                p = np.exp(np.array(logits) - max(logits))
                out[b, t, h] = (p / p.sum()) @ np.array(values)
    return out


def scan_nha(x, window, scale, empty_slots):
    return nha_reference(x["q"], x["k"], x["v"], x["s"], x["g"], window=window, scale=scale,
                         q_window=x["q_window"], k_window=x["k_window"], empty_slots=empty_slots)


def kernel_nha(x, window, scale, empty_slots, backend="gpu", blocks=TINY):
    return api.native_hybrid_attention(
        x["q"], x["k"], x["v"], x["s"], x["g"], window=window, scale=scale,
        q_window=x["q_window"], k_window=x["k_window"], empty_slots=empty_slots,
        block_sizes=blocks, backend=backend, interpret=True)


def value_and_grads(fn, x, weights):
    """fn(x) and the gradient of Σ weights·fn(x) w.r.t. every leaf of x: one compile."""
    loss = lambda x: (lambda out: (jnp.sum(out * weights), out))(fn(x))
    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(x)
    return out, grads


def check(x, window, empty_slots, backend="gpu", grads=True, blocks=TINY):
    scale = 0.5
    kernel = lambda x: kernel_nha(x, window, scale, empty_slots, backend, blocks)
    if grads:
        weights = normals(7, x["q"].shape[:3] + x["v"].shape[3:], dtype=np.float32)
        out, kernel_grads = value_and_grads(kernel, x, weights)
    else:
        out = kernel(x)
    assert_close(out, numpy_nha(x, window, scale, empty_slots), 1e-5, "values vs numpy")
    if not grads:
        return
    with jax.enable_x64(True):
        x64 = {n: jnp.asarray(a, jnp.float64) for n, a in x.items()}
        _, ref_grads = value_and_grads(lambda x: scan_nha(x, window, scale, empty_slots), x64,
                                       jnp.asarray(weights, jnp.float64))
        for name in NAMES:
            assert_close(kernel_grads[name], ref_grads[name], 1e-5, f"d{name}")


@pytest.mark.parametrize("empty_slots", ["mask", "sink"])
def test_references_agree(x64, empty_slots):
    x = {n: jnp.asarray(a, jnp.float64) for n, a in make_inputs(0, 1, 11, 2, 1).items()}
    out = jax.jit(lambda x: scan_nha(x, 3, 0.5, empty_slots))(x)
    assert_close(out, numpy_nha(x, 3, 0.5, empty_slots), 1e-12, "scan vs numpy")


def test_gpu_kernel():
    """T = 37 (odd: padded to 5 chunks of 8); w = 16 spans three key blocks and is a multiple of
    the chunk (the slot kernels read the slot inputs in place, two chunks back)."""
    check(make_inputs(1, 1, 37, 2, 2), 16, "mask")


def test_gpu_kernel_window_off_the_blocks():
    """w = 13, not a multiple of the 8-row blocks: each query block's band has a partly
    visible block on either side of the blocks it sees in full (which skip the mask), each key
    block's too; GQA, and the slot inputs come delayed (w is not a multiple of the chunk)."""
    check(make_inputs(2, 1, 29, 4, 2), 13, "sink")


def test_tpu_kernel():
    """The Mosaic TPU kernels (band on the grid, triangular-matmul cumsums) in TPU interpret
    mode: GQA, sink mode, w not a multiple of the chunk (delayed slot inputs)."""
    check(make_inputs(7, 1, 13, 4, 2), 3, "sink", backend="tpu", grads=False)


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 1, 5, 13, 37, 50])
def test_gpu_kernel_windows(window):
    """T = 37; windows 0 (pure slots), 1, non-multiples of the block, wider than a chunk,
    = T (causal attention, idle slots) and > T."""
    check(make_inputs(1, 1, 37, 2, 2), window, "mask")


@pytest.mark.slow
def test_gpu_kernel_strong_gates():
    """Gates strong enough (g down to about −40 per step) that chunks leave the single
    factorisation and take the exact path, with two sub-chunks per chunk."""
    x = make_inputs(5, 1, 23, 2, 2, gate_scale=8.0)
    assert float(jnp.min(x["g"])) < -30
    check(x, 3, "mask", blocks=dataclasses.replace(TINY, sub_chunk=4))


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "changes"), [
    ("gpu", {}), ("gpu", dict(split_slot_backward=True, slot_feature_block=2)),
    ("gpu", dict(split_slot_backward=True, slot_input_block=2, slot_input_slot_block=2)),
    ("tpu", {})])
def test_kernel_gates_past_float32_range(backend, changes):
    """One slot's log gate at −100 every step, others strong (the exact path): a factorisation
    at a sub-chunk boundary overflowed float32 inside the diagonal sub-chunk and gave NaN on
    the kernels only (sessions 24–25). Sub-chunk 4 of chunk 8: pieces across sub-chunks and by
    level within them; every exact-path form (whole and tiled features, whole and tiled slot
    inputs, the TPU kernels)."""
    x = make_inputs(5, 1, 21, 2, 2, gate_scale=8.0)
    g = x["g"].at[..., 1].set(-100.0)
    x.update(g=g, s=1.0 - jnp.exp(g))
    check(x, 3, "mask", backend=backend,
          blocks=dataclasses.replace(TINY, sub_chunk=4, **changes))


@pytest.mark.parametrize(("steps", "pieces"), [
    ((0.0, 0.01, 1.0, 40.0, 200.0), "levels"), ((0.0, 0.01, 1.0, 3.0), "one")])
def test_exact_path_pieces_factor_each_pair_within_float_range(steps, pieces):
    """`chunk_math`'s exact path inside a sub-chunk: over the pieces, the products of the
    query and key factors sum to e^{G_t − G_j} on every pair j ≤ t of a sub-chunk and to 0 on
    the other pairs j ≤ t, and every piece's pairs are symmetric. Log gates of 0 to −200 a
    step (a factorisation at the sub-chunk boundary overflows there: e^{200}): split by level,
    no factor above 1; of 0 to −3 a step (no sub-chunk of 16 decays by e^{−60}): one piece,
    factorised at each sub-chunk's last row: query factors ≤ e^{60}, key factors ≤ 1. (The
    forms mask the pairs j > t; so does this sum.)"""
    C, M = 16, 4
    g = -np.random.default_rng(0).choice(steps, (C, M))
    G = jnp.asarray(np.cumsum(g, axis=0), jnp.float32)
    t, j = np.arange(C)[:, None], np.arange(C)[None, :]
    causal = jnp.asarray(t >= j)

    def piece_of(query, key, piece, carry):
        total, largest, largest_key, smallest, asymmetric, count = carry
        factors = jnp.stack([query, key])
        return (total + (piece & causal)[:, :, None] * query[:, None, :] * key[None],
                jnp.maximum(largest, jnp.max(factors)), jnp.maximum(largest_key, jnp.max(key)),
                jnp.minimum(smallest, jnp.min(factors)),
                asymmetric | jnp.any(piece != piece.T), count + 1)

    for S in (1, 2, 8, 16):
        init = (jnp.zeros((C, C, M)), jnp.float32(0), jnp.float32(0), jnp.float32(1),
                jnp.bool_(False), jnp.int32(0))
        total, largest, largest_key, smallest, asymmetric, count = jax.jit(
            lambda G, S=S, init=init: chunk_math._diagonal_pieces(
                G, lambda r: lax.dynamic_slice_in_dim(G, r, 1), S, piece_of, init))(G)
        one = pieces == "one" or S == 1  # a sub-chunk of one row decays by nothing
        assert int(count) == (1 if one else S.bit_length()), f"S {S}"
        limit = np.exp(chunk_math.FAST_PATH_LIMIT) if one else 1.0
        assert float(largest) <= limit and float(smallest) >= 0.0 and not bool(asymmetric)
        assert float(largest_key) <= 1.0, f"S {S}: a key factor above 1"
        pairs = ((t >= j) & (t // S == j // S))[..., None]
        G64 = np.asarray(G, np.float64)
        want = np.exp(np.where(pairs, G64[:, None] - G64[None, :], -np.inf))
        np.testing.assert_allclose(np.asarray(total), want, rtol=1e-5, atol=1e-30,
                                   err_msg=f"S {S}")


def test_a_form_refuses_an_unknown_path():
    g = lambda start, size: jnp.zeros((size, 2))
    with pytest.raises(ValueError, match=r"path must be one of \('fast', 'exact', 'both'\), "
                                         r"got 'slow'"):
        chunk_math.slot_readout(jnp.ones((4, 2)), g, g, g, jnp.ones((3, 2)), S=2, state=None,
                                intra=None, path="slow")


@pytest.mark.slow
def test_gpu_kernel_gqa_sink():
    """Two query heads per kv head, empty slots as zero-value sinks."""
    check(make_inputs(2, 2, 21, 4, 2), 6, "sink")


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 30])
def test_gpu_kernel_sink_edges(window):
    """Sink mode with no window, and with w ≥ T (slots stay empty sinks)."""
    check(make_inputs(3, 1, 19, 2, 1), window, "sink")


@pytest.mark.slow
def test_tpu_kernel_gradients():
    """TPU kernels: GQA, w a multiple of the chunk (in-place slot inputs), gradients."""
    check(make_inputs(6, 1, 21, 4, 2), 8, "mask", backend="tpu")


def _interpret(monkeypatch, backend=None, blocks=TINY):
    """The ops' pallas rungs run the `backend`'s kernels (default: the GPU's) in interpret mode
    with the tiny tiles (on this CPU they would otherwise refuse: no kernel platform)."""
    monkeypatch.setattr(api, "native_hybrid_attention", functools.partial(
        api.native_hybrid_attention, interpret=True, block_sizes=blocks, backend=backend))
    monkeypatch.setattr(api, "unsupported", functools.partial(api.unsupported, interpret=True,
                                                              backend=backend))


@pytest.fixture
def interpret_kernels(monkeypatch):
    _interpret(monkeypatch)


# Row 0: document starts at 8 (a chunk and key-block edge) and 9 (a 1-token document), then one
# longer than every window tested; row 1: a start at 13 (off the edges).
PACKED = jnp.asarray([[0] * 8 + [1] + [2] * 28, [0] * 13 + [1] * 24], jnp.int32)


def _op_loss(implementation, args, state, *, window, segment_ids, empty_slots, weights):
    """Σ w·o + Σ w·final slots of the NHA op (documents, state, final state), and (o, final)."""
    from hybrid_jax.ops.nha import native_hybrid_attention

    out, final = native_hybrid_attention(
        *args[:5], window=window, q_window=args[5], k_window=args[6], segment_ids=segment_ids,
        initial_state=state, return_final_state=True, empty_slots=empty_slots, chunk_size=8,
        implementation=implementation)
    loss = (jnp.sum(weights[0] * out) + jnp.sum(weights[1] * final.slot_keys)
            + jnp.sum(weights[2] * final.slot_values))
    return loss, (out, final)


def check_op(T, window, *, state=True, segment_ids=PACKED, empty_slots="mask", H=4, G=2, K=3,
             V=4, M=3, D=5, grads=True):
    """The NHA op's pallas rung (float32, interpret mode) against the numpy loop (outputs,
    final slots) and the float64 reference rung (gradients of every input and of the initial
    state's arrays, through the outputs and the final slots)."""
    dims = dict(G=G, K=K, V=V, M=M, D=D)
    args = op_tests._inputs(T, H=H, seed=T + window, dtype=jnp.float32, **dims)
    segment_ids = None if segment_ids is None else segment_ids[:, :T]
    # The state's length puts row 0's document start (position 0) before its ring, so that its
    # initial slots count (row 1's document starts in the ring and resets them): with both rows
    # reset, their exact gradient is 0 in the kernels (a start is a mask) and ≈ e^-120 in the
    # reference (a start is a gate of RESET_LOG_DECAY), a relative error of 1 that tests nothing.
    with jax.enable_x64(True):  # the state's float64 draws, before the float32 kernel runs
        base = op_tests._random_state(window + 3, window=window, length=max(11, window + 3),
                                      **dims) if state else None
    weights = normals(9, (2, T, H, V), (2, G, K, M), (2, G, M, V), dtype=np.float32)
    options = dict(window=window, segment_ids=segment_ids, empty_slots=empty_slots)
    floats = lambda tree, dtype: jax.tree.map(
        lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
        else jnp.asarray(x), tree)
    grad = lambda impl, dtype, ws: jax.jit(jax.value_and_grad(
        functools.partial(_op_loss, impl, **options, weights=ws), argnums=(0, 1),
        has_aux=True, allow_int=True))
    if grads:
        (_, (out, final)), kernel_grads = grad("pallas", jnp.float32, weights)(
            args, floats(base, jnp.float32))
    else:
        _, (out, final) = jax.jit(functools.partial(_op_loss, "pallas", **options,
                                                    weights=weights))(args, floats(base,
                                                                                   jnp.float32))
    expected, (slot_keys, slot_values, starts) = op_tests.numpy_nha(
        *args[:5], window, K**-0.5, *args[5:], segment_ids=segment_ids, state=base,
        empty_slots=empty_slots)
    what = f"T={T} w={window} state={state} documents={segment_ids is not None} {empty_slots}"
    assert_close(out, expected, 1e-5, what + " values")
    assert_close((final.slot_keys, final.slot_values), (slot_keys, slot_values), 1e-5,
                 what + " final slots")
    np.testing.assert_array_equal(final.document_start, starts)
    if not grads:
        return
    with jax.enable_x64(True):
        _, ref_grads = grad("reference", jnp.float64, [jnp.asarray(w, jnp.float64)
                                                        for w in weights])(
            floats(args, jnp.float64), floats(base, jnp.float64))
    for name, got, ref in zip(NAMES, kernel_grads[0], ref_grads[0], strict=True):
        assert_close(got, ref, 1e-5, f"{what} d{name}")
    if state:
        for name in base._fields[:7]:
            assert_close(getattr(kernel_grads[1], name), getattr(ref_grads[1], name), 1e-5,
                         f"{what} d state.{name}")


def test_op_documents_state_gqa(interpret_kernels):
    """The op's pallas rung with packed documents, an initial state whose document starts in
    the ring (batch row 1), the final state, GQA and w = 5 (not a multiple of the chunk: the
    ring and the call's slot inputs are copied into one stream)."""
    check_op(29, 5)


@pytest.mark.parametrize("window, grads", [
    (5, False), *(pytest.param(w, True, marks=pytest.mark.slow) for w in (5, 8, 16))])
def test_op_documents_state_gqa_tpu(monkeypatch, window, grads):
    """The TPU kernels under the op's pallas rung: packed documents and an initial state (the
    window kernels' document masks and ring offset), GQA; w = 5 (values, and gradients in the
    slow suite), w = 8 (one chunk: d state.g was 1.1e-5 off before the chunk total became G's
    last row, NOTES.md "TPU lowering") and w = 16 (a ring of two chunks)."""
    _interpret(monkeypatch, "tpu")
    check_op(29, window, grads=grads)


def test_op_split_slot_backward(monkeypatch):
    """The backward slot kernels split in two each (`BlockSizes.split_slot_backward`, the GPU
    default): documents, an initial state whose ring is two chunks (w = 16; key arrays without
    padding before the ring, the gradients of the initial slots through a two-chunk delay), GQA."""
    monkeypatch.setattr(api, "native_hybrid_attention", functools.partial(
        api.native_hybrid_attention, interpret=True,
        block_sizes=dataclasses.replace(TINY, split_slot_backward=True)))
    monkeypatch.setattr(api, "unsupported", functools.partial(api.unsupported, interpret=True))
    check_op(29, 16)


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 16])
def test_gpu_kernel_split_slot_backward(window):
    """The split backward slot kernels at w = 0 (all the softmax mass on the slots, GQA, sink
    mode) and w = 16 (slot inputs read in place, two chunks back)."""
    blocks = dataclasses.replace(TINY, split_slot_backward=True)
    check(make_inputs(2, 1, 21, 4, 2), window, "sink" if window == 0 else "mask", blocks=blocks)


# The slot-input kernels over feature tiles in a loop, the slots in parts between
# (`BlockSizes.slot_input_block`): tiles and parts of 2, so that every loop takes several steps.
TILED = dataclasses.replace(TINY, split_slot_backward=True, slot_input_block=2,
                            slot_input_slot_block=2)


@pytest.mark.parametrize(("T", "window", "split"), [
    (37, 16, True), pytest.param(37, 16, False, marks=pytest.mark.slow),
    pytest.param(37, 0, True, marks=pytest.mark.slow)])
def test_op_slot_input_tiles(monkeypatch, T, window, split):
    """`BlockSizes.slot_input_block`, split and fused slot-input kernels: packed documents, an
    initial state (at w = 16 its ring is two chunks), GQA, odd T, w = 0 (the slots alone)
    and 16; 4 key, 8 value features and 4 slots in tiles of 2. (T 37 at w = 0 draws gates down
    to −128 a step, past the float32 range of the exact path before session 26.)"""
    _interpret(monkeypatch, blocks=dataclasses.replace(TILED, split_slot_backward=split))
    check_op(T, window, K=4, V=8, M=4)


@pytest.mark.slow
@pytest.mark.parametrize(("window", "options"), [
    (0, {}), (16, {}), (3, dict(sub_chunk=4, gate_scale=8.0))])
def test_gpu_kernel_slot_input_tiles(window, options):
    """`BlockSizes.slot_input_block` through the kernel API: w = 0 (GQA, sink mode), w = 16
    (slot inputs read in place), and strong gates (the exact path's sub-chunk loop)."""
    gate_scale = options.pop("gate_scale", 0.5)
    x = make_inputs(2, 1, 37 if window != 3 else 23, 4, 2, gate_scale=gate_scale)
    check(x, window, "sink" if window == 0 else "mask",
          blocks=dataclasses.replace(TILED, **options))


# The forward slot kernels and the backward's dA / P and dq kernels over feature tiles
# (`BlockSizes.slot_feature_block`): tiles of 2, so that every loop takes several steps.
FEATURE_TILED = dataclasses.replace(TINY, slot_feature_block=2)


@pytest.mark.parametrize(("T", "window", "blocks"), [
    (37, 16, dict(split_slot_backward=True)),
    # unpipelined: one load of the scores form's x feeds both its products
    (37, 16, dict(split_slot_backward=True, slot_feature_num_stages=1)),
    pytest.param(35, 0, {}, marks=pytest.mark.slow),  # the slots alone, the fused backward
    pytest.param(37, 5, dict(split_slot_backward=True, slot_input_block=2,
                             slot_input_slot_block=2), marks=pytest.mark.slow)])  # D 256's form
def test_op_slot_feature_tiles(monkeypatch, T, window, blocks):
    """`BlockSizes.slot_feature_block` through the op: packed documents, an initial state (at
    w = 16 its ring is two chunks), GQA, odd T, w = 0 and 5 (a window off the blocks); 4 key,
    8 value features in tiles of 2; with the slot-input kernels' feature loop too; unpipelined
    (x loaded once for the scores form's two products, not twice)."""
    _interpret(monkeypatch, blocks=dataclasses.replace(FEATURE_TILED, **blocks))
    check_op(T, window, K=4, V=8, M=4)


@pytest.mark.slow
@pytest.mark.parametrize(("window", "options"), [
    (0, {}), (1, {}), (13, dict(split_slot_backward=True)), (50, {}),
    (3, dict(sub_chunk=4, gate_scale=8.0)), (5, dict(dim=64, slot_feature_block=16))])
def test_gpu_kernel_slot_feature_tiles(window, options):
    """`BlockSizes.slot_feature_block` through the kernel API, values and every input's
    gradient: w = 0 (GQA, sink mode), 1, 13 (off the blocks), 50 ≥ T, strong gates (the exact
    paths), and head dim 64 in tiles of 16."""
    gate_scale, dim = options.pop("gate_scale", 0.5), options.pop("dim", 8)
    x = make_inputs(2, 1, 37 if window != 3 else 23, 4, 2, key_dim=dim, value_dim=dim,
                    gate_scale=gate_scale)
    check(x, window, "sink" if window == 0 else "mask",
          blocks=dataclasses.replace(FEATURE_TILED, **options))


# The window dk/dv kernel with key-major score tiles (`BlockSizes.window_keys_transposed`), and
# D 256's window tiles to time with it: query blocks of twice the chunk, keys in steps of half
# of it (and the dk/dv kernel's query steps shorter than its key blocks, as at D 256).
KEYS_TRANSPOSED = dataclasses.replace(TINY, window_keys_transposed=True)
WIDE_QUERIES = dict(block_q=16, block_k=4, block_q_dkv=4)


@pytest.mark.parametrize(("T", "window", "blocks"), [
    (37, 16, dict(split_slot_backward=True)),
    pytest.param(37, 5, dict(WIDE_QUERIES, split_slot_backward=True, slot_feature_block=2),
                 marks=pytest.mark.slow),  # D 256's form, a window off the blocks
    pytest.param(31, 40, {}, marks=pytest.mark.slow)])  # w ≥ T: no slots
def test_op_window_keys_transposed(monkeypatch, T, window, blocks):
    """`BlockSizes.window_keys_transposed` through the op: packed documents, an initial state
    (at w = 16 its ring is two chunks, at w 40 longer than the call), GQA, odd T."""
    _interpret(monkeypatch, blocks=dataclasses.replace(KEYS_TRANSPOSED, **blocks))
    check_op(T, window, K=4, V=8, M=4)


@pytest.mark.slow
@pytest.mark.parametrize(("window", "options"), [
    (0, {}), (1, {}), (13, dict(split_slot_backward=True)), (50, {}), (3, WIDE_QUERIES),
    (20, dict(WIDE_QUERIES, block_k_dkv=16)), (6, dict(block_q_dkv=16, block_k_dkv=4))])
def test_gpu_kernel_window_keys_transposed(window, options):
    """`BlockSizes.window_keys_transposed` through the kernel API, values and every input's
    gradient: w = 0 (GQA, sink mode), 1, 13 and 3 (off the blocks), 50 ≥ T; query blocks of
    twice the chunk, key steps of half of it, dk/dv blocks of 16 keys with query steps of 4,
    and 16 query rows a step over blocks of 4 keys."""
    check(make_inputs(2, 1, 37, 4, 2), window, "sink" if window == 0 else "mask",
          blocks=dataclasses.replace(KEYS_TRANSPOSED, **options))


def test_block_sizes_reject_a_non_bool_switch():
    with pytest.raises(ValueError, match="window_keys_transposed must be a bool, got 1"):
        BlockSizes(window_keys_transposed=1)


@pytest.mark.parametrize("backend, grads", [
    ("gpu", False), ("tpu", False), pytest.param("gpu", True, marks=pytest.mark.slow),
    pytest.param("tpu", True, marks=pytest.mark.slow)])
def test_gsa_pallas_rung(monkeypatch, backend, grads):
    """GSA's pallas rung (the NHA kernels at w = 0, float32; the GPU's and the TPU's) against
    GSA's float64 reference rung: packed documents, an initial state, the final state; values,
    and (slow) gradients of every input and of the initial state."""
    from hybrid_jax.ops.gsa import gated_slot_attention

    _interpret(monkeypatch, backend)
    T, H = 27, 2
    x = op_tests._inputs(T, H=H, G=H, seed=3, dtype=jnp.float32)[:5]
    state = tuple(normals(4, (2, H, 3, 3), (2, H, 3, 4), dtype=np.float32))
    weights = normals(5, (2, T, H, 4), (2, H, 3, 3), (2, H, 3, 4), dtype=np.float32)

    def run(impl, dtype):
        def loss(x, state):
            out, final = gated_slot_attention(*x, initial_state=state, return_final_state=True,
                                              segment_ids=PACKED[:, :T], chunk_size=8,
                                              implementation=impl)
            total = sum(jnp.sum(w.astype(dtype) * y) for w, y in zip(weights, (out, *final),
                                                                     strict=True))
            return total, (out, final)

        cast = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, dtype), tree)
        if not grads:
            return jax.jit(loss)(cast(x), cast(state)), None
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(cast(x),
                                                                               cast(state))

    (_, got), kernel_grads = run("pallas", jnp.float32)
    with jax.enable_x64(True):
        (_, expected), ref_grads = run("reference", jnp.float64)
    assert_close(got, expected, 1e-5, "GSA values and final slots")
    if grads:
        assert_close(kernel_grads, ref_grads, 1e-5, "GSA gradients")


def test_op_documents_full_window(interpret_kernels):
    """w ≥ T without a state (nha-hybrid's full-window layers on packed text): the slots stay
    idle and the window kernels alone run, masked to each document (values; gradients in the
    slow suite)."""
    check_op(21, 30, state=False, grads=False)


# Documents longer than a few key blocks: row 0 starts documents at 5 and 25 (off the tile
# edges), row 1 at 32 (on one).
LONG_DOCUMENTS = jnp.asarray([[0] * 5 + [1] * 20 + [2] * 22, [0] * 32 + [1] * 15], jnp.int32)


@pytest.mark.parametrize(("window", "state"), [(47, False), (33, True)])
def test_op_document_bounds(interpret_kernels, monkeypatch, window, state):
    """Windows of ≥ `DOCUMENT_BOUNDS_BLOCKS` tiles over packed documents: the GPU window
    kernels visit only the key blocks from each query block's earliest document start (forward,
    dq) and the query blocks up to each key block's last document token (dk, dv). Full window
    (nha-hybrid's layers) and a long window from a state; values and every gradient."""
    extents = []
    monkeypatch.setattr(api, "document_extents",
                        lambda ids: extents.append(ids.shape) or document_extents(ids))
    check_op(47, window, state=state, segment_ids=LONG_DOCUMENTS)
    assert extents, "the bounds were not used"


@pytest.mark.slow
@pytest.mark.parametrize(("T", "window", "options"), [
    (29, 16, dict(state=False)),  # w = 2 chunks: the slot inputs read in place, final slots
    (29, 3, dict(state=False, empty_slots="sink")),
    (29, 0, {}),  # no window: the slots alone, from a state, across documents
    (29, 5, dict(segment_ids=None, empty_slots="sink")),  # a state without segment ids
    (21, 40, {}),  # w > T: the whole call inside the ring's window
    (37, 16, {}),  # a state with a ring of two chunks, documents
    (29, 24, dict(segment_ids=None)),  # a ring of three chunks, no segment ids
    (21, 1, dict(state=False, segment_ids=None)),
    (21, 30, dict(state=False)),  # idle slots, documents: gradients
])
def test_op_documents_and_states(interpret_kernels, T, window, options):
    check_op(T, window, **options)


@pytest.mark.slow
def test_op_head_dim_256(interpret_kernels):
    """Head dims of 256 (nha-340m) with GQA, documents and a state."""
    check_op(13, 3, H=2, G=1, K=256, V=256, M=4, D=256)


@pytest.mark.parametrize(("window", "head_dim", "kv_heads", "options", "kernels"), [
    (200, 128, 2, dict(documents=True, state=True), 15),  # fwd 7 kernels, bwd 8
    pytest.param(512, 128, 2, {}, 15, marks=pytest.mark.slow),  # plain, slot inputs in place
    pytest.param(512, 128, 2, dict(precision="split"), 15, marks=pytest.mark.slow),
    pytest.param(512, 128, 2, dict(split_slot_backward=True), 19, marks=pytest.mark.slow),
    (200, 128, 2, dict(documents=True, state=True, split_slot_backward=True,
                       slot_input_block=64), 19),  # the slot-input kernels' feature loop
    (32, 256, 1, dict(documents=True, state=True, split_slot_backward=True,
                      slot_input_block=64), 19),  # D 256's defaults (nha-340m's layer)
    (32, 256, 1, dict(documents=True, state=True, split_slot_backward=True,
                      slot_input_block=64, slot_feature_block=64), 19),  # and the slot kernels'
    (32, 256, 1, dict(documents=True, state=True, split_slot_backward=True,
                      slot_input_block=64, slot_feature_block=64, window_keys_transposed=True,
                      block_q=128, backward_num_stages=3), 19),  # session 19's window tiles
    pytest.param(32, 256, 1, dict(documents=True, state=True), 15, marks=pytest.mark.slow),
    pytest.param(0, 128, 4, dict(documents=True, state=True), 12, marks=pytest.mark.slow),
    (2000, 128, 2, dict(documents=True), 3),  # idle slots, the window kernels' document bounds
])
def test_kernels_lower_to_triton_at_gpu_shapes(monkeypatch, window, head_dim, kv_heads,
                                               options, kernels):
    """Forward and backward build their Triton kernels (Pallas' Triton lowering, no GPU
    needed) at the GPU's default tiles and real sizes (M = 64, bf16 q/k/v, float32 s/g),
    with documents, a state and the final slots. Each slot kernel counts twice (its fast
    and its exact chunks: `slot_kernels._call`)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
    B, T, H, M, D = 1, 1000, 4, 64, head_dim
    ring = window if options.get("state") else 0
    blocks = dataclasses.replace(default_block_sizes("gpu", D),
                                 slot_precision=options.get("precision", "mixed"),
                                 split_slot_backward=options.get("split_slot_backward", False),
                                 slot_input_block=options.get("slot_input_block"),
                                 slot_feature_block=options.get("slot_feature_block"),
                                 **{name: options[name] for name in (
                                     "window_keys_transposed", "block_q", "backward_num_stages")
                                    if name in options})
    inputs = [spec(B, T, H, D), spec(B, T, kv_heads, D), spec(B, T, kv_heads, D),
              spec(B, T, kv_heads, M, dtype=jnp.float32),
              spec(B, T, kv_heads, M, dtype=jnp.float32), spec(B, T, H, D),
              spec(B, T, kv_heads, D)]
    documents = (api.Documents(spec(B, ring + T, dtype=jnp.int32),
                               spec(B, ring + T, dtype=jnp.bool_))
                 if options.get("documents") else None)
    ring_shapes = [(D, D), (D, D), (M, jnp.float32), (M, jnp.float32), (D, D)]
    state = (api.State(spec(B, kv_heads, D, M, dtype=jnp.float32),
                       spec(B, kv_heads, M, D, dtype=jnp.float32),
                       *(spec(B, ring, kv_heads, d, dtype=jnp.bfloat16 if t == D else t)
                         for d, t in ring_shapes))
             if options.get("state") else None)

    def grads(x, documents, state):
        def run(*x):
            return api.native_hybrid_attention(
                *x[:5], window=window, q_window=x[5], k_window=x[6], documents=documents,
                initial_state=state, return_final_state=True, block_sizes=blocks)

        out, vjp = jax.vjp(run, *x)
        return vjp(out)

    text = jax.jit(grads).trace(inputs, documents, state).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == kernels


def test_op_pallas_rung_names_why_it_cannot_run():
    """`hybrid_jax.ops.native_hybrid_attention(implementation="pallas")` on this CPU names the
    reason (no kernel platform), with documents and a state too."""
    from hybrid_jax.ops.nha import native_hybrid_attention, nha_empty_state

    x = make_inputs(8, 1, 8, 2, 2)
    args = [x[n] for n in NAMES[:5]]
    segments = jnp.zeros((1, 8), jnp.int32)
    state = nha_empty_state(1, 2, 8, 8, 4, 2)
    for options in ({}, dict(segment_ids=segments, initial_state=state)):
        with pytest.raises(ValueError, match="platform"):
            jax.eval_shape(lambda *a, o=options: native_hybrid_attention(
                *a, window=2, implementation="pallas", **o), *args)


def test_unsupported_reasons():
    x = make_inputs(4, 1, 8, 2, 2)
    args = [x[n] for n in NAMES[:5]]
    assert api.unsupported(*args, window=2, backend="cpu") is not None  # no kernel on CPU
    assert api.unsupported(*args, window=2, interpret=True) is None
    assert "window" in api.unsupported(*args, window=-1, interpret=True)
    assert "empty_slots" in api.unsupported(*args, window=1, empty_slots="x", interpret=True)
    bad_k = x["k"][:, :, :, :4]
    assert "k has shape" in api.unsupported(args[0], bad_k, *args[2:], window=1, interpret=True)
    with pytest.raises(ValueError, match="cannot|platform"):
        api.native_hybrid_attention(*args, window=2, backend="cpu")
    documents = api.documents_from_segment_ids(jnp.zeros((1, 8), jnp.int32))
    assert api.unsupported(*args, window=2, documents=documents, interpret=True) is None
    assert api.unsupported(*args, window=2, documents=documents, backend="tpu",
                           interpret=True) is None
    assert "documents.ids has shape" in api.unsupported(
        *args, window=2, documents=api.Documents(documents.ids[:, 1:], documents.starts[:, 1:]),
        interpret=True)
    assert "initial_state must be a State" in api.unsupported(
        *args, window=2, initial_state=(x["k"], x["v"]), interpret=True)


def _gpu_kernel_operands(args, blocks) -> dict[str, int]:
    """Operands of each Pallas kernel of the op's fwd+bwd traced for the GPU."""
    grad = jax.grad(lambda *a: jnp.sum(api.native_hybrid_attention(
        *a, window=2, block_sizes=blocks).astype(jnp.float32)), argnums=tuple(range(5)))
    operands = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                operands[eqn.params["name"]] = len(eqn.invars)
            elif "jaxpr" in eqn.params:
                walk(getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"]))

    walk(jax.make_jaxpr(grad)(*args).jaxpr)
    return operands


@pytest.mark.parametrize("changes", [{}, dict(split_slot_backward=False),
                                     dict(slot_backward_num_warps=8), dict(slot_num_warps=8)])
def test_gpu_pipelined_feature_tiles_load_the_scores_x_twice(monkeypatch, changes):
    """The race fix (NOTES.md, session 19, "The race"; checked on an H200 in session 20): with
    the feature loop pipelined, the scores form's x (q in the logits, dO in dA / P) goes into
    its kernel twice, so that the pairs' async wgmma reads tiles of its own; unpipelined,
    once. Every launch form lowers for the GPU (8 warps, unsplit: no longer refused)."""
    x = make_inputs(4, 1, 64, 2, 2, key_dim=64, value_dim=64, window_dim=64, slots=16)
    args = [x[n].astype(jnp.bfloat16) for n in NAMES[:5]]
    monkeypatch.setattr(api.target, "platform", lambda: "gpu")
    tiled = dataclasses.replace(BlockSizes(slot_feature_block=32, split_slot_backward=True,
                                           slot_backward_num_warps=4), **changes)
    pipelined = _gpu_kernel_operands(args, tiled)
    once = _gpu_kernel_operands(args, dataclasses.replace(tiled, slot_feature_num_stages=1))
    twice = {"nha_slot_logits", "nha_slot_backward_probabilities" if tiled.split_slot_backward
             else "nha_slot_backward_queries"}
    twice |= {f"{name}_exact" for name in twice}  # the exact path's launches (`_call`)
    assert {name for name in once if pipelined[name] != once[name]} == twice
    assert all(pipelined[name] == once[name] + 1 for name in twice)
    lowered = jax.jit(lambda *a: api.native_hybrid_attention(
        *a, window=2, block_sizes=tiled)).trace(*args).lower(lowering_platforms=("cuda",))
    assert "nha_slot_logits" in lowered.as_text()


@pytest.mark.slow
@pytest.mark.parametrize(("window", "dtype"), [(0, jnp.bfloat16), (16, jnp.bfloat16),
                                               (0, jnp.float16)])
def test_gpu_kernel_16bit_slot_precisions(window, dtype):
    """16-bit inputs: the "float32", (default) "mixed" and "split" slot precisions stay within
    16-bit rounding (2 %) of the float64 reference, values and gradients, with all the softmax
    mass on the slots (w = 0) too; "mixed" does round some gradient products (it differs)."""
    x = {n: a.astype(dtype) for n, a in make_inputs(5, 1, 37, 2, 2).items()}
    weights = normals(7, (1, 37, 2, 8), dtype=np.float32)
    with jax.enable_x64(True):
        x64 = {n: jnp.asarray(a, jnp.float64) for n, a in x.items()}
        ref_out, ref_grads = value_and_grads(lambda x: scan_nha(x, window, 0.5, "mask"), x64,
                                             jnp.asarray(weights, jnp.float64))
    grads = {}
    for precision in ("float32", "mixed", "split"):
        blocks = dataclasses.replace(TINY, slot_precision=precision)
        out, grads[precision] = value_and_grads(
            lambda x, blocks=blocks: kernel_nha(x, window, 0.5, "mask", blocks=blocks
                                                ).astype(jnp.float32), x, weights)
        assert_close(out, ref_out, 2e-2, f"{precision} values")
        for name in NAMES:
            assert_close(grads[precision][name], ref_grads[name], 2e-2, f"{precision} d{name}")
    assert any(not np.array_equal(grads["float32"][n], grads["mixed"][n]) for n in ("q", "k"))


def test_empty_inputs_are_refused():
    """T = 0: a reason, not a ZeroDivisionError in the kernels."""
    args = op_tests._inputs(0, H=2, G=1, dtype=jnp.float32)
    reason = api.unsupported(*args[:5], window=2, q_window=args[5], k_window=args[6],
                             backend="gpu", interpret=True)
    assert "may be empty" in reason
