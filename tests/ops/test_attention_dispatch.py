"""Which attention rung auto picks on a GPU and on a TPU for the benchmark shapes, and that a
fallback logs (the backend is patched to "gpu" or "tpu"; shapes only, nothing runs there)."""

from __future__ import annotations

import importlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.ops import dispatch
from hybrid_jax.sharding import make_mesh

attention_module = importlib.import_module("hybrid_jax.ops.attention")  # ops.attention: the op


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(dispatch, "backend", lambda: "gpu")
    monkeypatch.setattr(attention_module, "backend", lambda: "gpu")
    dispatch._LOGGED.clear()


@pytest.fixture
def on_tpu(monkeypatch):
    monkeypatch.setattr(dispatch, "backend", lambda: "tpu")
    monkeypatch.setattr(attention_module, "backend", lambda: "tpu")
    dispatch._LOGGED.clear()


def shapes(batch, length, heads, kv_heads, head_dim, dtype=jnp.bfloat16):
    q = jax.ShapeDtypeStruct((batch, length, heads, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((batch, length, kv_heads, head_dim), dtype)
    return q, kv, kv


# (name, B, T, H, G, D, window): the attention layers of the throughput benchmark.
BENCHMARK = [("transformer-125m", 16, 2048, 12, 12, 64, None),
             ("transformer-125m", 4, 8192, 12, 12, 64, None),
             ("transformer-350m", 8, 2048, 16, 16, 64, None),
             ("transformer-350m", 1, 32768, 16, 16, 64, None),
             ("gqa-swa", 4, 8192, 16, 4, 128, 1024),
             ("head-dim-256", 4, 8192, 4, 4, 256, None)]


@pytest.mark.parametrize("name,B,T,H,G,D,window", BENCHMARK)
def test_packed_batches_take_the_pallas_kernel(on_gpu, name, B, T, H, G, D, window):
    q, k, v = shapes(B, T, H, G, D)
    segments = jax.ShapeDtypeStruct((B, T), jnp.int32)
    assert ops.attention_rung(q, k, v, window=window, segment_ids=segments) == "pallas", name
    unpacked = ops.attention_rung(q, k, v, window=window)
    assert unpacked == ("pallas" if D > 128 else "cudnn"), name


@pytest.mark.parametrize("name,B,T,H,G,D,window", BENCHMARK)
def test_tpu_takes_the_splash_kernel(on_tpu, name, B, T, H, G, D, window):
    q, k, v = shapes(B, T, H, G, D)
    segments = jax.ShapeDtypeStruct((B, T), jnp.int32)
    assert ops.attention_rung(q, k, v, window=window, segment_ids=segments) == "splash", name
    assert ops.attention_rung(q, k, v, window=window) == "splash", name


@pytest.mark.parametrize("name,B,T,Dv", [("oryx-mamba2-130m", 16, 2048, 1536),
                                          ("oryx-mamba2-340m", 4, 8192, 2048)])
def test_wide_values_take_the_kernels(monkeypatch, on_gpu, name, B, T, Dv):
    """Oryx's Mamba-2 attention mode (one key head of 128, values of the inner width) runs the
    kernels as value slices, not the XLA rung's `[T, T]` logits."""
    q = jax.ShapeDtypeStruct((B, T, 1, 128), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((B, T, 1, Dv), jnp.bfloat16)
    segments = jax.ShapeDtypeStruct((B, T), jnp.int32)
    assert ops.attention_rung(q, q, v, segment_ids=segments) == "pallas", name
    assert ops.attention_rung(q, q, v) == "cudnn", name
    for platform in ("tpu", "gpu"):
        monkeypatch.setattr(dispatch, "backend", lambda p=platform: p)
        monkeypatch.setattr(attention_module, "backend", lambda p=platform: p)
        expected = "splash" if platform == "tpu" else "pallas"
        assert ops.attention_rung(q, q, v, segment_ids=segments) == expected, name
    # Attention-mode rows only (random_chunks training): packed, the flash kernel, which skips
    # the others' blocks; unpacked, cuDNN over every row (still the faster there).
    active = jax.ShapeDtypeStruct((B, T), jnp.bool_)
    assert ops.attention_rung(q, q, v, segment_ids=segments, active_queries=active) == "pallas"
    assert ops.attention_rung(q, q, v, active_queries=active) == "cudnn", name
    odd = jax.ShapeDtypeStruct((B, T, 1, 200), jnp.bfloat16)  # not a multiple: refused, XLA
    assert ops.attention_rung(q, q, odd, segment_ids=segments) == "xla", name
    # A refusal of the slices names the caller's widths too.
    with pytest.raises(ValueError, match=rf"\(values {Dv} wide as {Dv // 128} slices of 128\) "
                                         "explicit positions / segment_ids"):
        ops.attention_rung(q, q, v, segment_ids=segments, implementation="cudnn")


def test_tpu_logs_fallbacks_only(on_tpu, caplog):
    """Splash runs without a word (the GPU rungs are no candidates on a TPU); a fallback to XLA
    logs splash's reason."""
    q, k, v = shapes(2, 256, 4, 2, 64)
    segments = jax.ShapeDtypeStruct((2, 256), jnp.int32)
    positions = jnp.arange(256)
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        jax.eval_shape(lambda q, k, v, ids: ops.attention(q, k, v, window=100, segment_ids=ids),
                       q, k, v, segments)
        jax.eval_shape(lambda q, k, v: ops.attention(q, k, v, q_positions=positions), q, k, v)
        jax.eval_shape(lambda q, k, v: ops.attention(q, k, v, causal=False), q, k, v)
    messages = [r.getMessage() for r in caplog.records if r.name == "hybrid_jax.dispatch"]
    assert len(messages) == 2 and all("ran the xla rung" in m for m in messages), messages
    assert "splash: explicit positions" in messages[0] and "needs causal=True" in messages[1]
    assert not any("cudnn" in m or "pallas" in m for m in messages), messages


def test_splash_refuses_inside_a_shard_map(on_tpu):
    """An enclosing shard_map checks varying axes, which JAX's splash kernels do not state."""
    mesh = make_mesh(MeshConfig(data=2))
    q = jnp.zeros((2, 128, 2, 64), jnp.bfloat16)
    chosen = []

    def body(q):
        chosen.append(ops.attention_rung(q, q, q))
        return q

    with jax.set_mesh(mesh):
        jax.make_jaxpr(jax.shard_map(body, in_specs=P("data"), out_specs=P("data")))(q)
    assert chosen == ["xla"]
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="inside a shard_map"):
        jax.make_jaxpr(jax.shard_map(lambda q: ops.attention(q, q, q, implementation="splash"),
                                     in_specs=P("data"), out_specs=P("data")))(q)


def test_fallback_to_xla_logs_once_per_shape(on_gpu, caplog):
    q, k, v = (jnp.asarray(np.random.default_rng(0).standard_normal((1, 16, 2, 64)),
                           jnp.float32) for _ in range(3))
    segments = jnp.zeros((1, 16), jnp.int32)
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        ops.attention(q, k, v, segment_ids=segments)
        ops.attention(q, k, v, segment_ids=segments)  # same shape: no second record
        ops.attention(q[:, :8], k[:, :8], v[:, :8], segment_ids=segments[:, :8])
    records = [r for r in caplog.records if r.name == "hybrid_jax.dispatch"]
    assert len(records) == 2
    assert records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert "ran the xla rung" in message and "bfloat16/float16" in message, message
    assert "splash" not in message, message  # a TPU kernel: no candidate on a GPU


def test_another_reason_at_the_same_shapes_logs_again(on_gpu, caplog):
    """The once-only key holds the reasons: `causal=False` after a causal call of the same
    shapes gives a reason of its own, which was not logged."""
    q = jnp.zeros((1, 16, 2, 64), jnp.float32)  # no fast rung: XLA either way
    segments = jnp.zeros((1, 16), jnp.int32)
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        for causal in (True, True, False):
            jax.eval_shape(lambda q, ids, causal=causal: ops.attention(
                q, q, q, segment_ids=ids, causal=causal), q, segments)
    messages = [r.getMessage() for r in caplog.records if r.name == "hybrid_jax.dispatch"]
    assert len(messages) == 2, messages
    assert "causal" not in messages[0] and "causal" in messages[1], messages


def test_no_log_on_cpu(caplog, monkeypatch):
    dispatch._LOGGED.clear()
    q = jnp.zeros((1, 8, 2, 64))
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        ops.attention(q, q, q, segment_ids=jnp.zeros((1, 8), jnp.int32))
    assert not [r for r in caplog.records if r.name == "hybrid_jax.dispatch"]


def _count(jaxpr, name: str) -> int:
    """Equations of primitive `name` in a jaxpr and all its sub-jaxprs (scan, vjp, cond...)."""
    found = 0
    for eqn in jaxpr.eqns:
        found += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _count(inner, name)
    return found


def test_packed_model_sorts_the_segment_ids_once(on_gpu, monkeypatch):
    """The flash kernel's document extents (a sort) come once per batch from the context,
    not once per attention layer (3 unscanned layers here)."""
    from flax import nnx

    from hybrid_jax.config import ModelConfig
    from hybrid_jax.context import TokenContext
    from hybrid_jax.nn.lm import LanguageModel
    from pallas_kernels.flash_attention import api

    calls, flash_attention = [], api.flash_attention

    def kernel(*args, **kwargs):  # the pallas rung's call, run by the interpreter on CPU
        calls.append(kwargs["extents"])
        return flash_attention(*args, **kwargs, interpret=True)

    monkeypatch.setattr(api, "flash_attention", kernel)
    model = LanguageModel(ModelConfig(layers=("attention",) * 3, vocab_size=16, d_model=128,
                                      num_heads=2, dtype="bfloat16"), rngs=nnx.Rngs(0))
    tokens = jnp.zeros((2, 32), jnp.int32)
    ids = jnp.asarray(np.repeat([[0, 1, 2, 3]], 8, axis=1).repeat(2, 0), jnp.int32)
    sorts = lambda context: _count(jax.make_jaxpr(lambda i: model(tokens, context(i)))(ids).jaxpr,
                                   "sort")
    assert sorts(lambda i: TokenContext.create(tokens.shape, segment_ids=i)) == 1
    assert len(calls) == 3 and all(c is not None for c in calls)
    # A context without extents (built field by field): each layer sorts.
    assert sorts(lambda i: TokenContext(positions=jnp.zeros(tokens.shape, jnp.int32),
                                        segment_ids=i)) == 3


def test_packed_model_on_tpu_runs_splash(on_tpu, caplog):
    """A model's attention layers on packed text, as the trainer calls them: the splash
    kernels (forward traced, nothing logged)."""
    from flax import nnx

    from hybrid_jax.config import ModelConfig
    from hybrid_jax.context import TokenContext
    from hybrid_jax.nn.lm import LanguageModel

    model = LanguageModel(ModelConfig(layers=("attention",) * 2, vocab_size=16, d_model=128,
                                      num_heads=2, window=8, dtype="bfloat16"),
                          rngs=nnx.Rngs(0))
    tokens = jnp.zeros((2, 32), jnp.int32)
    ids = jnp.asarray(np.repeat([[0, 1, 2, 3]], 8, axis=1).repeat(2, 0), jnp.int32)
    with caplog.at_level(logging.INFO, logger="hybrid_jax.dispatch"):
        jaxpr = jax.make_jaxpr(lambda i: model(tokens, TokenContext.create(
            tokens.shape, segment_ids=i)))(ids).jaxpr
    assert _count(jaxpr, "pallas_call") == 2
    assert not [r for r in caplog.records if r.name == "hybrid_jax.dispatch"]


def test_pallas_rung_runs_the_kernel_for_a_gpu_target():
    """Traced for a GPU (an abstract mesh whose device is a GPU, as an ahead-of-time lowering
    on a CPU host) the pallas rung runs the flash kernel, named or chosen by auto: the
    kernels' entry point once read the host's default backend and ran its XLA reference."""
    device = jax.sharding.AbstractDevice(device_kind="H100", num_cores=None, platform="gpu")
    q = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((1, 64), jnp.int32)
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=device)):
        for implementation in ("pallas", None):
            jaxpr = jax.make_jaxpr(lambda q, i, impl=implementation: ops.attention(
                q, q, q, segment_ids=i, implementation=impl))(q, ids).jaxpr
            assert _count(jaxpr, "pallas_call") == 1, implementation


def test_cudnn_rung_zeroes_inactive_rows(monkeypatch):
    """cuDNN computes every row (`jax.nn.dot_product_attention`, here its XLA form on the CPU);
    the rung zeroes the inactive ones, as the op's definition says."""
    real = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention",
                        lambda *a, implementation, **kw: real(*a, implementation="xla", **kw))
    q, k, v = (jnp.asarray(np.random.default_rng(i).normal(size=(2, 9, 2, 8)), jnp.float32)
               for i in range(3))
    active = jnp.asarray(np.random.default_rng(3).random((2, 9)) < 0.5)
    kwargs = dict(causal=True, window=4, scale=0.3, segment_ids=None, q_positions=None,
                  kv_positions=None, kv_segment_ids=None)
    out = attention_module.attention_cudnn(q, k, v, active_queries=active, **kwargs)
    want = ops.attention(q, k, v, window=4, scale=0.3, implementation="reference")
    np.testing.assert_allclose(out, jnp.where(active[..., None, None], want, 0), atol=1e-5)
