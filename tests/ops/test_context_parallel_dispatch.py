"""Context-parallel calls go through each op's dispatcher (`hybrid_jax.ops.dispatch`) with what
a kernel needs, on a backend patched to "gpu" (calls are traced, nothing runs on a GPU):

* a fake fastest rung that supports everything (as a kernel taking `initial_state`, the final
  state and segment ids) is chosen automatically on every shard, and gets the incoming state
  of the shard and the document starts;
* the ops with Pallas kernels (SSD, GSA, NHA, and attention, whose heads split over the shards)
  lower, forward and backward, to those kernels on every shard (Triton lowering for a GPU,
  without one);
* where a rung refuses (attention whose heads do not split: the shard's kernels take no
  explicit positions; here: no GPU), the fallback to XLA is logged once, with the reason.
"""

from __future__ import annotations

import functools
import importlib
import logging

import jax
import jax.numpy as jnp
import pytest

from hybrid_jax.config import MeshConfig
from hybrid_jax.ops import context_parallel as cp
from hybrid_jax.ops import dispatch
from hybrid_jax.ops.dispatch import Rung
from hybrid_jax.sharding import make_mesh
from pallas_kernels import target
from tests.ops.test_context_parallel import SEGMENT_IDS, T, _draw, _log_gates, _with_segment_ids

attention_module = importlib.import_module("hybrid_jax.ops.attention")
OP_MODULES = {"ssd": "hybrid_jax.ops.ssd", "selective_scan": "hybrid_jax.ops.selective_scan",
              "dss": "hybrid_jax.ops.dss", "gated_delta_rule": "hybrid_jax.ops.delta_rule",
              "gated_slot_attention": "hybrid_jax.ops.gsa"}


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    monkeypatch.setattr(attention_module, "backend", lambda: "gpu")
    dispatch._LOGGED.clear()


def _with_fake_kernel(monkeypatch, module_name: str) -> list[dict]:
    """Puts a rung that accepts every call first in the op's rungs; it records each call's
    keyword arguments and runs the XLA rung. Returns the list of recorded calls."""
    module = importlib.import_module(module_name)
    xla = next(rung for rung in module._RUNGS if rung.name == "xla")
    calls: list[dict] = []

    def kernel(*args, **kwargs):
        calls.append(kwargs)
        return xla.fn(*args, **kwargs)

    monkeypatch.setattr(module, "_RUNGS", (Rung("kernel", kernel),) + tuple(module._RUNGS))
    return calls


def _trace_on_shards(fn, args, shards=2):
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=shards), jax.devices()[:shards])):
        jax.jit(fn).trace(*args)


@pytest.mark.parametrize("name", sorted(OP_MODULES))
def test_recurrences_reach_a_kernel_with_the_incoming_state(on_gpu, monkeypatch, name):
    calls = _with_fake_kernel(monkeypatch, OP_MODULES[name])
    fn, args = _with_segment_ids(name)
    if name == "dss":  # the test helper forces the xla rung: let auto choose
        fn = functools.partial(cp.dss, segment_ids=SEGMENT_IDS, return_final_state=True)
        args = (args[0], *_dss_params())
    _trace_on_shards(fn, args)
    assert calls, f"{name}: the context-parallel call did not choose the fastest rung"
    # Every call takes a state: pass 1 (the shard's offset, from zeros), pass 2 (from the true
    # incoming state) and, for the delta rule, the shard's map (from the identity).
    for kwargs in calls:
        state = kwargs["initial_state"]
        assert state is not None and all(x.shape[0] == 2 for x in jax.tree.leaves(state))
    # Passes 1 and 2 also take the shard's document starts.
    with_starts = [kwargs["starts"].shape for kwargs in calls if kwargs["starts"] is not None]
    assert with_starts == [(2, T // 2)] * 2, with_starts


def _dss_params():
    log_decay = jax.lax.complex(-jnp.asarray([[0.1, 0.5], [0.3, 1.0]]),
                                jnp.asarray([[0.3, 1.0], [2.0, 0.1]]))
    return log_decay, jax.lax.complex(*_draw(17, (2, 2), (2, 2)))


def _nha_args():
    q, k, v, qw, kw = _draw(14, (2, T, 2, 4), (2, T, 1, 4), (2, T, 1, 3), (2, T, 2, 4),
                            (2, T, 1, 4))
    g = _log_gates(15, (2, T, 1, 3), -1.0)
    return q, k, v, 1 - jnp.exp(g), g, qw, kw


def _nha(window, segment_ids, dtype=jnp.float32):
    def fn(q, k, v, s, g, qw, kw):
        q, k, v, qw, kw = (x.astype(dtype) for x in (q, k, v, qw, kw))
        return cp.native_hybrid_attention(q, k, v, s, g, q_window=qw, k_window=kw,
                                          window=window, segment_ids=segment_ids, chunk_size=4)
    return fn


@pytest.mark.parametrize("segment_ids", [None, SEGMENT_IDS], ids=["one-document", "packed"])
def test_nha_reaches_a_kernel_with_the_incoming_state(on_gpu, monkeypatch, segment_ids):
    calls = _with_fake_kernel(monkeypatch, "hybrid_jax.ops.nha")
    _trace_on_shards(_nha(3, segment_ids), _nha_args())
    assert len(calls) == 1
    call = calls[0]["call"]
    # The shard continues from an NHAState (a ring of 3 tokens, the slots), with the segment
    # ids only when there are documents.
    assert call.state is not None and call.state.keys.shape[1] == 3 and calls[0]["window"] == 3
    assert call.state.slot_keys.shape == (2, 1, 4, 3)
    assert (call.segment_ids is None) == (segment_ids is None)
    assert call.q.shape == (2, T // 2, 2, 4)


def _records(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "hybrid_jax.dispatch"]


@pytest.mark.parametrize("window", [None, 3], ids=["all-gather", "halo"])
def test_attention_logs_its_fallback_once(on_gpu, caplog, window):
    """Heads that do not split over the shards (3 over 2) keep time split: the XLA rung."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _draw(13, (2, T, 3, 64), (2, T, 3, 64),
                                                     (2, T, 3, 64)))
    fn = functools.partial(cp.attention, window=window)
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        _trace_on_shards(fn, (q, k, v))
        _trace_on_shards(fn, (q, k, v))  # same shapes: logged once
    (message,) = _records(caplog)
    assert "attention: ran the xla rung" in message, message
    assert "cudnn: explicit positions" in message and "pallas: explicit positions" in message
    assert "0[2, 16, 3, 64] bfloat16" in message  # the shard's queries


def _spec(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


KERNEL_CALLS = {  # the ops with Pallas kernels, on GPU shapes (T = 256: shards of 128)
    "attention": (  # heads for time: the whole sequence's flash attention, a device's heads
        lambda q, k, v, ids: cp.attention(q, k, v, segment_ids=ids),
        (_spec(2, 256, 4, 64), _spec(2, 256, 2, 64), _spec(2, 256, 2, 64))),
    "ssd": (lambda x, dt, A, B, C, ids: cp.ssd(x, dt, A, B, C, segment_ids=ids),
            (_spec(2, 256, 2, 64), _spec(2, 256, 2, dtype=jnp.float32),
             _spec(2, dtype=jnp.float32), _spec(2, 256, 1, 64), _spec(2, 256, 1, 64))),
    "gated_slot_attention": (
        lambda q, k, v, s, g, ids: cp.gated_slot_attention(q, k, v, s, g, segment_ids=ids),
        (_spec(2, 256, 2, 64),) * 3 + (_spec(2, 256, 2, 64, dtype=jnp.float32),) * 2),
    "native_hybrid_attention": (
        lambda q, k, v, s, g, ids: cp.native_hybrid_attention(q, k, v, s, g, window=32,
                                                              segment_ids=ids),
        (_spec(2, 256, 2, 64),) + (_spec(2, 256, 1, 64),) * 2
        + (_spec(2, 256, 1, 64, dtype=jnp.float32),) * 2),
}


@pytest.mark.parametrize("name", sorted(KERNEL_CALLS))
def test_context_parallel_calls_lower_to_the_kernels(monkeypatch, caplog, name):
    """On a GPU (Pallas' Triton lowering, no GPU needed) a context-parallel call, forward and
    backward, with documents, runs the op's Pallas kernels on every shard: no XLA fallback
    (the kernels take the shard's state and documents, and their outputs carry shard_map's
    varying axes)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(target, "platform", lambda: "gpu")  # under the mesh of CPU devices
    dispatch._LOGGED.clear()
    fn, args = KERNEL_CALLS[name]

    def loss(*args):
        return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(fn(*args)))

    grads = jax.grad(loss, argnums=tuple(range(len(args))))
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=2), jax.devices()[:2])):
            text = jax.jit(grads).trace(*args, _spec(2, 256, dtype=jnp.int32)).lower(
                lowering_platforms=("cuda",)).as_text()
    # (Packed attention notes once that cuDNN takes no segment ids: flash, not XLA.)
    assert not [m for m in _records(caplog) if "ran the pallas rung" not in m], _records(caplog)
    assert text.count("__gpu$xla.gpu.triton") >= 3  # forward and backward kernels


@pytest.fixture
def attention_kernel(monkeypatch):
    """A fake fastest attention rung that context-parallel attention counts as a kernel (heads
    for time). Returns its recorded calls."""
    calls = _with_fake_kernel(monkeypatch, "hybrid_jax.ops.attention")
    cp_attention = importlib.import_module("hybrid_jax.ops.context_parallel.attention")
    monkeypatch.setattr(cp_attention, "_KERNEL_RUNGS", ("kernel",))
    return calls


@pytest.mark.parametrize("window", [T, 2 * T])
def test_nha_with_idle_slots_runs_as_attention_on_an_accelerator(on_gpu, monkeypatch,
                                                                  attention_kernel, window):
    """w ≥ T, empty slots masked: auto runs causal attention of the window branch, as the op's
    own auto does on an accelerator (no NHA state, no NHA op on the shards), as heads for time
    (2 window heads, 1 key head repeated, over 2 shards)."""
    calls = _with_fake_kernel(monkeypatch, "hybrid_jax.ops.nha")
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=2), jax.devices()[:2])):
        jaxpr = str(jax.make_jaxpr(_nha(window, SEGMENT_IDS))(*_nha_args()))
    assert not calls and attention_kernel and "all_to_all" in jaxpr


def test_nha_with_idle_slots_keeps_the_nha_rungs_where_attention_would_not_run_a_kernel(
        on_gpu, monkeypatch, attention_kernel, caplog):
    """Window heads that do not split over the shards (3 over 2): causal attention would run
    the XLA rung's scores on time shards, so auto keeps the NHA rungs (as the op's own auto
    keeps them where `ops.attention` would run XLA), and says so once."""
    calls = _with_fake_kernel(monkeypatch, "hybrid_jax.ops.nha")
    q, k, v, s, g, _, kw = _nha_args()
    q = jnp.concatenate([q, q[:, :, :1]], 2)  # 3 heads, one key group
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        for _ in range(2):
            _trace_on_shards(_nha(T, SEGMENT_IDS), (q, k, v, s, g, q, kw))
    assert calls and not attention_kernel
    (message,) = [m for m in _records(caplog) if "idle slots" in m]
    assert "heads 3 and key heads 1" in message and "[2, 32, 3, 4]" in message, message


def test_nha_logs_its_fallback_once(on_gpu, caplog):
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        _trace_on_shards(_nha(3, None, jnp.bfloat16), _nha_args())
        _trace_on_shards(_nha(3, None, jnp.bfloat16), _nha_args())
    (message,) = _records(caplog)
    assert "native_hybrid_attention: ran the xla rung" in message, message
    assert "faster rungs could not: pallas: " in message, message  # with the reason
