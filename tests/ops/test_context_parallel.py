"""Context-parallel ops on 8 fake CPU devices: with the time axis split over a `seq` mesh axis
of 2, 4 and 8 devices, every mixer op gives the single-device outputs, final states and
gradients (float32, 1e-5), with packed documents starting on and off shard boundaries and
windows narrower and wider than a shard (T = 32: shards of 16, 8 and 4 tokens)."""

import functools
import importlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.ops import context_parallel as cp
from hybrid_jax.ops.scan import linear_scan
from hybrid_jax.ops.segments import RESET_LOG_DECAY
from hybrid_jax.ops.selective_scan import selective_scan
from hybrid_jax.sharding import make_mesh
from tests.helpers import assert_close

T = 32
SHARDS = (2, 4, 8)
# Documents start at 8 (a shard boundary for 4 and 8 shards), 13 (inside every shard) and 16.
SEGMENT_IDS = jnp.asarray([[0] * 8 + [1] * 5 + [2] * 3 + [3] * 16, [0] * T], jnp.int32)
STARTS = np.asarray(SEGMENT_IDS[:, 1:] != SEGMENT_IDS[:, :-1])
STARTS = jnp.asarray(np.pad(STARTS, ((0, 0), (1, 0))))
OPS = types.SimpleNamespace(  # the single-device ops that `cp`'s are checked against
    ssd=ops.ssd, selective_scan=selective_scan, dss=ops.dss, linear_scan=linear_scan,
    gated_delta_rule=ops.gated_delta_rule, gated_slot_attention=ops.gated_slot_attention,
    short_conv=ops.short_conv)


def _draw(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in shapes]


def _log_gates(seed, shape, reset):
    """Log decays in [−1, −0.01], `reset` at document starts (packed documents)."""
    g = -jnp.asarray(np.random.default_rng(seed).uniform(0.01, 1.0, shape), jnp.float32)
    starts = STARTS.reshape(STARTS.shape + (1,) * (len(shape) - 2))
    return jnp.where(starts, reset, g)


def _value_and_grads(fn, args, shards):
    """Outputs (all leaves) and the gradient of a fixed random projection of them."""

    def loss(args):
        out = fn(*args)
        leaves = [x for x in jax.tree.leaves(out) if jnp.issubdtype(x.dtype, jnp.floating)
                  or jnp.issubdtype(x.dtype, jnp.complexfloating)]
        weights = _draw(99, *(x.shape for x in leaves))
        return sum(jnp.sum(jnp.real(x) * w) for x, w in zip(leaves, weights, strict=True)), out

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    if shards == 1:
        return step(args)
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=shards), jax.devices()[:shards])):
        return step(args)


def check_matches_single_device(fn, args, shards=SHARDS, reference=None):
    """`fn` on each count of `shards` against `reference` (default: `fn` itself) on one
    device."""
    (_, expected), expected_grads = _value_and_grads(reference or fn, args, 1)
    for n in shards:
        (_, out), grads = _value_and_grads(fn, args, n)
        assert_close(out, expected, 1e-5, f"outputs, {n} shards")
        assert_close(grads, expected_grads, 1e-5, f"gradients, {n} shards")


def ssd_args():
    x, B, C = _draw(0, (2, T, 4, 3), (2, T, 2, 5), (2, T, 2, 5))
    A = -jnp.asarray([0.5, 1.0, 2.0, 0.2])
    dt = jnp.exp(_log_gates(1, (2, T, 4), 0.0)) * 0.5 + jnp.where(STARTS[..., None], 60.0, 0.0)
    return x, dt, A, B, C


@pytest.mark.parametrize("combine", cp.COMBINES)
def test_ssd(combine):
    fn = functools.partial(cp.ssd, chunk_size=4, return_final_state=True, combine=combine)
    check_matches_single_device(fn, ssd_args())


def test_ssd_initial_state():
    fn = functools.partial(cp.ssd, chunk_size=8, return_final_state=True)
    args = ssd_args()
    check_matches_single_device(lambda *a: fn(*a[:5], initial_state=a[5]),
                                args + tuple(_draw(5, (2, 4, 3, 5))), shards=(4,))


def test_selective_scan():
    x, B, C = _draw(2, (2, T, 2, 3), (2, T, 1, 4), (2, T, 1, 4))
    dt = jnp.exp(_log_gates(3, (2, T, 2, 3), -4.0))
    A = -jnp.exp(_draw(4, (2, 3, 4))[0])
    fn = functools.partial(cp.selective_scan, chunk_size=4, return_final_state=True)
    check_matches_single_device(fn, (x, dt, A, B, C))


def test_dss():
    (u,) = _draw(5, (2, T, 3))
    log_decay = jax.lax.complex(-jnp.asarray([[0.1, 0.5], [0.3, 1.0], [0.05, 0.2]]),
                                jnp.asarray([[0.3, 1.0], [2.0, 0.1], [0.5, 0.7]]))
    coeff = jax.lax.complex(*_draw(6, (3, 2), (3, 2)))
    fn = functools.partial(cp.dss, return_final_state=True, implementation="xla")
    check_matches_single_device(lambda u: fn(u, log_decay, coeff), (u,))


def test_dss_shards_take_their_own_intra_chunk_form():
    # One chunk of 32 on one device, of 8 on each of 4 shards: the single device's chunk and
    # shard 1 hold 4 documents (starts 9, 10, 11: the masked reduction), the other shards at most
    # 2 (matmuls); the choice is made per shard.
    (u,) = _draw(18, (2, T))
    ids = jnp.asarray([[0] * 9 + [1, 2] + [3] * 21, [0] * 20 + [1] * 12], jnp.int32)
    log_decay = jax.lax.complex(-jnp.asarray([[0.1, 0.5]]), jnp.asarray([[0.3, 1.0]]))
    coeff = jax.lax.complex(*_draw(19, (1, 2), (1, 2)))
    fn = functools.partial(cp.dss, segment_ids=ids, chunk_size=32, return_final_state=True,
                           implementation="xla")
    check_matches_single_device(lambda u: fn(u[..., None], log_decay, coeff), (u,), shards=(4,))


def test_linear_scan_with_resets():
    (b,) = _draw(7, (2, T, 3, 2))
    a = jnp.exp(_log_gates(8, (2, T, 3, 2), -jnp.inf))  # decay 0 at document starts
    check_matches_single_device(cp.linear_scan, (a, b))


def test_gated_delta_rule():
    q, k, v, beta = _draw(9, (2, T, 2, 4), (2, T, 2, 4), (2, T, 2, 3), (2, T, 2))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    g = _log_gates(10, (2, T, 2), RESET_LOG_DECAY)
    fn = functools.partial(cp.gated_delta_rule, chunk_size=4, return_final_state=True)
    check_matches_single_device(fn, (q, k, v, g, jax.nn.sigmoid(beta)))


def test_gated_slot_attention():
    q, k, v = _draw(11, (2, T, 2, 4), (2, T, 2, 4), (2, T, 2, 3))
    g = _log_gates(12, (2, T, 2, 3), RESET_LOG_DECAY)
    fn = functools.partial(cp.gated_slot_attention, chunk_size=4, return_final_state=True)
    check_matches_single_device(fn, (q, k, v, 1 - jnp.exp(g), g))


def _with_segment_ids(name, segment_ids=SEGMENT_IDS, module=cp, **extra):
    """An op's call with `segment_ids` (the production input; resets by the op, gates plain);
    the function from `module` (`cp`, or `OPS`: the single-device ops), `extra` keywords to it."""
    x, B, C = _draw(13, (2, T, 2, 3), (2, T, 1, 4), (2, T, 1, 4))
    q, k, v = _draw(14, (2, T, 2, 4), (2, T, 2, 4), (2, T, 2, 3))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    g = -jnp.asarray(np.random.default_rng(15).uniform(0.01, 1.0, (2, T, 2, 3)), jnp.float32)
    kwargs = dict(segment_ids=segment_ids, return_final_state=True, **extra)
    if name == "ssd":
        return (functools.partial(module.ssd, chunk_size=4, **kwargs),
                (x, jnp.exp(g[..., 0]), -jnp.asarray([0.5, 1.0]), B, C))
    if name == "selective_scan":
        return (functools.partial(module.selective_scan, chunk_size=4, **kwargs),
                (x, jnp.exp(g), -jnp.exp(_draw(16, (2, 3, 4))[0]), B, C))
    if name == "dss":
        log_decay = jax.lax.complex(-jnp.asarray([[0.1, 0.5], [0.3, 1.0]]),
                                    jnp.asarray([[0.3, 1.0], [2.0, 0.1]]))
        coeff = jax.lax.complex(*_draw(17, (2, 2), (2, 2)))
        fn = functools.partial(module.dss, implementation="xla", **kwargs)
        return (lambda u, **state: fn(u, log_decay, coeff, **state)), (x[..., 0],)
    if name == "gated_delta_rule":
        return (functools.partial(module.gated_delta_rule, chunk_size=4, **kwargs),
                (q, k, v, g[..., 0], jax.nn.sigmoid(x[..., 0])))
    return (functools.partial(module.gated_slot_attention, chunk_size=4, **kwargs),
            (q, k, v, 1 - jnp.exp(g), g))


@pytest.mark.parametrize("name", ["ssd", "selective_scan", "dss", "gated_delta_rule",
                                  "gated_slot_attention"])
def test_recurrences_with_segment_ids(name):
    # 4 shards of 8: documents start on the boundaries 8 and 16 and inside shard 1 (13).
    fn, args = _with_segment_ids(name)
    check_matches_single_device(fn, args, shards=(4,))


# Documents 5 and 4 continue the initial state (no reset at token 0, though the ids are not 0);
# row 0's next documents start inside shard 0 (3) and on the boundary 24 of 4 shards of 8.
CONTINUING_IDS = jnp.asarray([[5] * 3 + [6] * 21 + [7] * 8, [4] * T], jnp.int32)
INITIAL_STATE_SHAPES = {"ssd": (2, 2, 3, 4), "selective_scan": (2, 2, 3, 4),
                        "gated_delta_rule": (2, 2, 4, 3)}


def _initial_state(name):
    if name == "dss":
        return jax.lax.complex(*_draw(20, (2, 2, 2), (2, 2, 2)))
    if name == "gated_slot_attention":  # (K̃ [B, H, K, M], Ṽ [B, H, M, V])
        return tuple(_draw(20, (2, 2, 4, 3), (2, 2, 3, 3)))
    return _draw(20, INITIAL_STATE_SHAPES[name])[0]


@pytest.mark.parametrize("combine", cp.COMBINES)
@pytest.mark.parametrize("name", ["ssd", "selective_scan", "dss", "gated_delta_rule",
                                  "gated_slot_attention"])
def test_recurrences_continue_an_initial_state(name, combine):
    """Every recurrence's `initial_state` (values and gradients) reaches the first document
    through shard 0, and through every shard where that document spans the sequence, with
    either combine (the all-gather fold composes the delta rule's dense maps too): as the
    single-device op."""
    fn, args = _with_segment_ids(name, CONTINUING_IDS, combine=combine)
    op, _ = _with_segment_ids(name, CONTINUING_IDS, module=OPS)
    check_matches_single_device(lambda *a: fn(*a[:-1], initial_state=a[-1]),
                                args + (_initial_state(name),), shards=(4,),
                                reference=lambda *a: op(*a[:-1], initial_state=a[-1]))


@pytest.mark.parametrize("combine", cp.COMBINES)
def test_linear_scan_continues_an_initial_state(combine):
    (b, h0) = _draw(21, (2, T, 3, 2), (2, 3, 2))
    a = jnp.exp(_log_gates(22, (2, T, 3, 2), -jnp.inf))  # decay 0 at document starts
    fn = functools.partial(cp.linear_scan, combine=combine)
    check_matches_single_device(fn, (a, b, h0), shards=(4,),
                                reference=functools.partial(OPS.linear_scan, axis=1))


@pytest.mark.parametrize("window", [None, 3, 9, 20])
def test_attention(window):
    q, k, v = _draw(13, (2, T, 4, 4), (2, T, 2, 4), (2, T, 2, 3))
    fn = functools.partial(cp.attention, window=window, segment_ids=SEGMENT_IDS)
    check_matches_single_device(fn, (q, k, v))


@pytest.mark.parametrize("window", [None, 3])
def test_attention_without_segment_ids(window):
    q, k, v = _draw(13, (2, T, 4, 4), (2, T, 2, 4), (2, T, 2, 3))
    check_matches_single_device(functools.partial(cp.attention, window=window), (q, k, v),
                                shards=(4,))


HEAD_SPLITS = {  # (q, k, v) shapes: grouped heads, one key head (repeated), wide values
    "gqa": ((2, T, 4, 4), (2, T, 2, 4), (2, T, 2, 4)),
    "one key head": ((2, T, 4, 4), (2, T, 1, 4), (2, T, 1, 4)),
    "wide values": ((2, T, 1, 4), (2, T, 1, 4), (2, T, 1, 16)),
}


@pytest.fixture
def head_split_on_xla(monkeypatch):
    """The heads-for-time form where the XLA rung runs (on a GPU only where a kernel would)."""
    module = importlib.import_module("hybrid_jax.ops.context_parallel.attention")
    monkeypatch.setattr(module, "_KERNEL_RUNGS", ("xla",))


@pytest.mark.parametrize("case", sorted(HEAD_SPLITS))
@pytest.mark.parametrize("window", [None, 9])
def test_attention_heads_for_time(head_split_on_xla, case, window):
    """Each device attends over the whole sequence for its heads (all_to_all there and back),
    with the whole sequence's segment ids and their extents: the single-device result."""
    q, k, v = _draw(14, *HEAD_SPLITS[case])
    extents = ops.segment_extents(SEGMENT_IDS)
    fn = functools.partial(cp.attention, window=window, segment_ids=SEGMENT_IDS,
                           segment_extents=extents)
    check_matches_single_device(fn, (q, k, v), shards=(2, 4))


@pytest.mark.parametrize("form", ["heads for time", "time shards"])
def test_attention_active_queries(request, form):
    """Only the active query rows (Oryx's attention mode) are computed, the others 0, in both
    forms (each takes the rows of its queries: the whole sequence's, or the shard's)."""
    if form == "heads for time":
        request.getfixturevalue("head_split_on_xla")
    q, k, v = _draw(14, *HEAD_SPLITS["wide values"])
    active = jnp.asarray(np.random.default_rng(3).random((2, T)) < 0.5)
    fn = functools.partial(cp.attention, window=9, segment_ids=SEGMENT_IDS,
                           active_queries=active)
    check_matches_single_device(fn, (q, k, v), shards=(2, 4))
    out = jax.jit(fn)(q, k, v)
    assert np.all(np.asarray(out)[~np.asarray(active)] == 0) and np.any(np.asarray(out) != 0)


def _split_heads(fn, args, shards=4):
    """Whether `fn` on `shards` devices trades time for heads (an all_to_all in its program)."""
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=shards), jax.devices()[:shards])):
        return "all_to_all" in str(jax.make_jaxpr(fn)(*args))


def test_attention_keeps_time_split_where_heads_do_not(head_split_on_xla):
    q, k, v = _draw(14, (2, T, 6, 4), (2, T, 3, 4), (2, T, 3, 4))  # 6 heads, 4 devices
    fn = functools.partial(cp.attention, segment_ids=SEGMENT_IDS)
    assert _split_heads(fn, (q[:, :, :4], k[:, :, :2], v[:, :, :2]))
    assert not _split_heads(fn, (q, k, v))
    check_matches_single_device(fn, (q, k, v), shards=(4,))


@pytest.mark.parametrize("heads,causal", [(6, True), (4, False)])
def test_attention_named_kernel_needs_heads_for_time(heads, causal):
    """A named kernel rung takes no time shard (its positions are explicit): where the heads do
    not split over the shards, or the call is not causal, the refusal says so (not the
    shard's call's reason)."""
    q, k, v = _draw(14, (2, T, heads, 4), (2, T, 2, 4), (2, T, 2, 4))
    fn = functools.partial(cp.attention, causal=causal, implementation="pallas")
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=4), jax.devices()[:4])):
        with pytest.raises(ValueError, match=f"'pallas' runs over 4 'seq' devices only as heads "
                                             f"for time.*causal={causal}"):
            jax.jit(fn).trace(q, k, v)


def test_attention_on_the_xla_rung_keeps_time_split():
    """Without a kernel rung (here, on the CPU) the XLA rung's time shards (the same work and
    memory, and a halo for windows) stay."""
    q, k, v = _draw(14, *HEAD_SPLITS["gqa"])
    assert not _split_heads(functools.partial(cp.attention, segment_ids=SEGMENT_IDS), (q, k, v))


def test_attention_non_causal_window():
    """A band on both sides (|t − s| < w) needs the keys after the shard too: all-gathered K/V,
    not the causal halo; documents on both sides of the band."""
    q, k, v = _draw(13, (2, T, 4, 4), (2, T, 2, 4), (2, T, 2, 3))
    fn = functools.partial(cp.attention, causal=False, window=3, segment_ids=SEGMENT_IDS)
    check_matches_single_device(fn, (q, k, v), shards=(4,))


@pytest.mark.parametrize("name,change,message", [
    ("attention", dict(window=2.5), "window must be an int >= 1 or None, got 2.5"),
    ("attention", dict(segment_ids=SEGMENT_IDS[:, :16]),
     r"segment_ids \(shape \(2, 16\).* is 16, but q \(shape \(2, 32, 4, 4\)\) says 32"),
    ("native_hybrid_attention", dict(window=2.5), "window must be an int >= 0, got 2.5"),
    ("native_hybrid_attention", dict(segment_ids=SEGMENT_IDS[:, :16]),
     r"segment_ids \(shape \(2, 16\).* is 16, but given says 32")],
    ids=["attention-window", "attention-segment-ids", "nha-window", "nha-segment-ids"])
def test_bad_inputs_are_named_as_by_the_op(name, change, message):
    """On shards, what the op refuses gets the op's error with the whole sequence's shapes
    (not a shard's, nor a TypeError or broadcasting error from the halo or the documents)."""
    q, k, v = _draw(13, (2, T, 4, 4), (2, T, 2, 4), (2, T, 2, 4))
    g = _log_gates(15, (2, T, 2, 3), -1.0)
    args = (q, k, v) if name == "attention" else (q, k, v, 1 - jnp.exp(g), g)
    kwargs = dict(dict(window=3, segment_ids=SEGMENT_IDS), **change)
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=4), jax.devices()[:4])):
        with pytest.raises(ValueError, match=f"{name}: .*{message}"):
            jax.jit(functools.partial(getattr(cp, name), **kwargs)).trace(*args)


def test_cross_attention_is_an_error():
    q, k, v = _draw(13, (2, T, 4, 4), (2, T // 2, 2, 4), (2, T // 2, 2, 3))
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=4), jax.devices()[:4])):
        with pytest.raises(ValueError, match="self-attention without explicit positions"):
            jax.jit(cp.attention)(q, k, v)


# Window 0 on 8 shards (one 4-token chunk each) once gave NaN gradients under the conftest's
# XLA flags: the gradient of the softmax's row maximum divided by the count of logits equal to
# it, 0 where XLA recomputed them with another rounding (fixed in `masked_softmax`). A window
# past T (a halo from every earlier shard) on 8 shards only, to keep the test time down.
@pytest.mark.parametrize("window,shards", [(0, (2, 8)), (3, SHARDS), (9, SHARDS), (40, (8,))])
def test_native_hybrid_attention(window, shards):
    q, k, v, qw, kw = _draw(14, (2, T, 2, 4), (2, T, 1, 4), (2, T, 1, 3), (2, T, 2, 4),
                            (2, T, 1, 4))
    g = _log_gates(15, (2, T, 1, 3), -1.0)
    fn = functools.partial(cp.native_hybrid_attention, window=window, segment_ids=SEGMENT_IDS,
                           chunk_size=4)
    check_matches_single_device(lambda q, k, v, s, g, qw, kw: fn(q, k, v, s, g, q_window=qw,
                                                                  k_window=kw),
                                (q, k, v, 1 - jnp.exp(g), g, qw, kw), shards)


def test_native_hybrid_attention_without_segment_ids():
    q, k, v = _draw(14, (2, T, 2, 4), (2, T, 1, 4), (2, T, 1, 3))
    g = _log_gates(15, (2, T, 1, 3), -1.0)
    fn = functools.partial(cp.native_hybrid_attention, window=9, chunk_size=4)
    check_matches_single_device(fn, (q, k, v, 1 - jnp.exp(g), g), shards=(4,))


def test_native_hybrid_attention_attention_rung():
    """`implementation="attention"` (idle slots: w ≥ T, empty ones masked) is causal attention
    of the window branch at the op's scale (K^-½, window keys of another size D). A shard's
    call carries an NHA state, which that rung refuses: it runs as context-parallel attention.
    Row 1's id 0 comes back at 21 (another shard): a new document, as in the op."""
    q, k, v, qw, kw = _draw(14, (2, T, 2, 4), (2, T, 1, 4), (2, T, 1, 3), (2, T, 2, 6),
                            (2, T, 1, 6))
    g = _log_gates(15, (2, T, 1, 3), -1.0)
    ids = SEGMENT_IDS.at[1, 5:21].set(4)
    fn = functools.partial(cp.native_hybrid_attention, window=T, segment_ids=ids,
                           implementation="attention")
    check_matches_single_device(lambda q, k, v, s, g, qw, kw: fn(q, k, v, s, g, q_window=qw,
                                                                  k_window=kw),
                                (q, k, v, 1 - jnp.exp(g), g, qw, kw), shards=(4,))


# 3 shards of 7 tokens: a shard count that is not a power of two (the ppermute scan's last
# step reaches back less than its stride), an odd shard length, windows of exactly one shard;
# row 0's documents start on the edge 7 and one token after the edge 14, row 1 is one document
# across every shard (both continue the delta rule's initial state). The recurrences run their
# per-token rung: a fifth of the chunked rungs' compile time, and the same shard composition.
ODD_T = 21
ODD_IDS = jnp.asarray([[0] * 7 + [1] * 8 + [2] * 6, [3] * ODD_T], jnp.int32)


def _odd_shards_call(name, module):
    """`name` from `module` (`cp`, or `ops`: the single-device op) on ODD_T tokens, and its
    inputs."""
    q, k, v, qw, kw = _draw(25, (2, ODD_T, 2, 4), (2, ODD_T, 1, 4), (2, ODD_T, 1, 3),
                            (2, ODD_T, 2, 4), (2, ODD_T, 1, 4))
    g = -jnp.asarray(np.random.default_rng(26).uniform(0.01, 1.0, (2, ODD_T, 1, 3)),
                     jnp.float32)
    options = dict(segment_ids=ODD_IDS, implementation="reference")
    if name == "gated_delta_rule":
        fn = functools.partial(module.gated_delta_rule, return_final_state=True, **options)
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
        return (lambda *a: fn(*a[:-1], initial_state=a[-1]),
                (q[:, :, :1], k, v, g[..., 0], jax.nn.sigmoid(g[..., 1]),
                 _draw(27, (2, 1, 4, 3))[0]))
    if name == "native_hybrid_attention":
        fn = functools.partial(module.native_hybrid_attention, window=7, **options)
        return (lambda q, k, v, s, g, qw, kw: fn(q, k, v, s, g, q_window=qw, k_window=kw),
                (q, k, v, 1 - jnp.exp(g), g, qw, kw))
    return functools.partial(module.attention, window=7, segment_ids=ODD_IDS), (q, k, v)


@pytest.mark.parametrize("name", ["gated_delta_rule", "native_hybrid_attention", "attention"])
def test_odd_shard_counts_and_lengths(name):
    (fn, args), (op, _) = (_odd_shards_call(name, module) for module in (cp, ops))
    check_matches_single_device(fn, args, shards=(3,), reference=op)


@pytest.mark.parametrize("width", [3, 6, 29])
def test_short_conv_halo(width):
    """Halos within one shard, across shards, and (29) one token wider than the 28 before the
    last of 8 shards of 4: the halo starts with zeros from before the sequence."""
    (x,) = _draw(16, (2, T, 3))
    weight = _draw(17, (width + 1, 3))[0]

    def conv(inputs, weight):  # y_t = Σ_i w_i x_{t−i}, within documents
        x, segment_ids = inputs
        y = x * weight[0]
        for lag in range(1, weight.shape[0]):
            shifted = jnp.pad(x, ((0, 0), (lag, 0), (0, 0)))[:, :x.shape[1]]
            prev = jnp.pad(segment_ids, ((0, 0), (lag, 0)), constant_values=-1)[:, :x.shape[1]]
            y = y + jnp.where((prev == segment_ids)[..., None], shifted, 0.0) * weight[lag]
        return y

    check_matches_single_device(
        lambda x, w: cp.with_past(conv, width, (x, SEGMENT_IDS), w), (x, weight))


@pytest.mark.parametrize("taps", [4, 10])
def test_short_conv(taps):
    """`cp.short_conv` is the op (bias, SiLU, documents starting on and off shard boundaries):
    a halo of K − 1 = 3 tokens, and of 9, wider than 8 shards' 4 tokens (two predecessors)."""
    x, weight, bias = _draw(23, (2, T, 3), (taps, 3), (3,))
    kwargs = dict(segment_ids=SEGMENT_IDS, activation=True)
    check_matches_single_device(functools.partial(cp.short_conv, **kwargs), (x, weight, bias),
                                reference=functools.partial(OPS.short_conv, **kwargs))


def test_short_conv_passes_its_options_to_the_op(monkeypatch):
    """Each shard's call gets the options (`head_channels` picks how the Pallas rung splits
    channels on a GPU; the XLA rung ignores it)."""
    module = importlib.import_module("hybrid_jax.ops.context_parallel.short_conv")
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    real = module._short_conv
    monkeypatch.setattr(module, "_short_conv", spy)
    x, weight = _draw(24, (2, T, 3), (3, 3))
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=2), jax.devices()[:2])):
        jax.jit(functools.partial(cp.short_conv, activation=True, head_channels=True,
                                  implementation="xla"))(x, weight)
    assert [{k: c[k] for k in ("activation", "head_channels", "implementation")}
            for c in calls] == [dict(activation=True, head_channels=True, implementation="xla")]


def test_indivisible_time_is_an_error():
    x, dt, A, B, C = (a[:, :30] if a.ndim > 1 else a for a in ssd_args())
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=4), jax.devices()[:4])):
        with pytest.raises(ValueError, match="time axis divisible by 4, got shape"):
            jax.jit(cp.ssd)(x, dt, A, B, C)


@pytest.mark.parametrize("name", ["ssd", "short_conv"])
def test_sequence_inputs_of_other_lengths_are_an_error(name):
    """Segment ids of 16 tokens for 32 (both divisible by 4): named with the whole shapes, not
    by the op's check of a shard's 4 ids against its 8 tokens."""
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=4), jax.devices()[:4])):
        with pytest.raises(ValueError, match=r"needs one time length \(axis 1\) for every "
                           r"sequence input, got shapes \[\(2, 32, .*\), \(2, 16\)\]"):
            if name == "ssd":
                x, dt, A, B, C = ssd_args()
                jax.jit(cp.ssd).trace(x, dt, A, B, C, segment_ids=SEGMENT_IDS[:, :16])
            else:
                x, weight = _draw(24, (2, T, 3), (3, 3))
                jax.jit(cp.short_conv).trace(x, weight, segment_ids=SEGMENT_IDS[:, :16])


def test_inside_a_shard_map_over_seq_the_ops_run_on_the_local_tokens():
    """A caller already manual over `seq` (its own shard_map) gets each device's tokens run as
    their own sequence: the ops do not split time again."""
    from jax.sharding import PartitionSpec as P

    x, dt, A, B, C = ssd_args()
    fn = functools.partial(cp.ssd, chunk_size=4)
    halves = [fn(*(a[:, part] if a.ndim > 1 else a for a in (x, dt, A, B, C)))
              for part in (slice(0, T // 2), slice(T // 2, T))]
    time_split = P(None, "seq")
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=2), jax.devices()[:2])):
        local = jax.jit(jax.shard_map(
            fn, in_specs=(time_split, time_split, P(), time_split, time_split),
            out_specs=time_split, axis_names={"seq"}))(x, dt, A, B, C)
    assert_close(local, jnp.concatenate(halves, axis=1), 1e-5, "per-shard sequences")
