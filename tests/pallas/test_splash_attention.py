"""The TPU splash-attention rung (`pallas_kernels/flash_attention/splash.py`, JAX's kernels) in
interpret mode on CPU, float32, against the XLA reference with segment ids: values and
gradients of q, k, v; its TPU lowering at the benchmark shapes; on a mesh.

T = 200 pads to 256, two 128-token blocks (the kernels' smallest), so a row spans several
query and key blocks, with document boundaries on and off the block edge, documents of length
1, odd lengths and a document longer than the window. Interpreted splash is slow (~2 s a case):
few cases.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.sharding import make_mesh
from pallas_kernels.flash_attention import splash
from tests.helpers import assert_close, lower_for_tpu, normals
from tests.pallas.test_flash_attention import segments_from_lengths

attention_module = importlib.import_module("hybrid_jax.ops.attention")  # ops.attention: the op
BLOCKS = splash.default_block_sizes(128)
# Row 0: a boundary at 128 (the block edge), 1-token documents, odd lengths; row 1: boundaries
# off the edges and a 150-token document, longer than the window of 100.
PACKED = segments_from_lengths([1, 127, 3, 1, 67, 1], [5, 150, 2, 43])


@pytest.fixture
def splash_on_cpu(monkeypatch):
    """`ops.attention`'s splash rung as on a TPU, the kernels interpreted with 128-token tiles."""
    monkeypatch.setattr(attention_module, "backend", lambda: "tpu")
    monkeypatch.setattr(splash, "splash_attention", functools.partial(
        splash.splash_attention, interpret=True, block_sizes=BLOCKS))
    monkeypatch.setattr(splash, "unsupported", functools.partial(splash.unsupported,
                                                                 interpret=True))


def _loss(implementation, segment_ids, window):
    def f(q, k, v):
        out = ops.attention(q, k, v, window=window, scale=0.3, segment_ids=segment_ids,
                            implementation=implementation)
        return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape))), out
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))


def check(q, k, v, segment_ids, window):
    (_, out), grads = _loss("splash", segment_ids, window)(q, k, v)
    (_, ref), ref_grads = _loss("reference", segment_ids, window)(q, k, v)
    what = f"window={window} segments={segment_ids is not None} G={k.shape[2]}"
    assert_close(out, ref, 1e-5, what + " values")
    assert_close(grads, ref_grads, 1e-5, what + " gradients")


@pytest.mark.parametrize("window", [None, 100])  # 100: under a block, not a multiple of one
def test_packed_gqa_matches_reference(splash_on_cpu, window):
    q, k, v = normals(0, (2, 200, 4, 8), (2, 200, 2, 8), (2, 200, 2, 8), dtype=np.float32)
    check(q, k, v, PACKED, window)


def test_unpacked_mqa_matches_reference(splash_on_cpu):
    q, k, v = normals(1, (1, 200, 2, 8), (1, 200, 1, 8), (1, 200, 1, 8), dtype=np.float32)
    check(q, k, v, None, None)


def test_window_of_the_whole_row_is_causal():
    """w ≥ T is the causal mask (no band): the same program as window=None."""
    q, k, v = normals(2, (1, 200, 2, 8), (1, 200, 1, 8), (1, 200, 1, 8), dtype=np.float32)
    program = lambda window: str(jax.make_jaxpr(functools.partial(
        splash.splash_attention, window=window, block_sizes=BLOCKS, interpret=True))(
        q, k, v, PACKED[1:]))
    assert program(200) == program(None) != program(199)


def test_rejects_what_a_tpu_cannot_run():
    """(The shape, id and window checks are the GPU kernels', tested with them.)"""
    q = jnp.zeros((1, 16, 2, 64))
    with pytest.raises(ValueError, match="splash_attention: needs bfloat16/float32"):
        splash.splash_attention(*(x.astype(jnp.float16) for x in (q,) * 3))
    assert "head_dim must be one of" in splash.unsupported(q[..., :8], q[..., :8], q[..., :8])
    assert splash.unsupported(q, q, q) is None  # float32 runs on a TPU too


# (B, T, H, G, D, window): the throughput benchmark's attention layers (125M at T 2048, GQA
# with a sliding window at T 8192) and head dim 256.
LOWERED = [(16, 2048, 12, 12, 64, 512), (4, 8192, 16, 4, 128, 1024), (2, 2048, 4, 4, 256, None)]


@pytest.mark.parametrize("B,T,H,G,D,window", LOWERED)
def test_rung_lowers_for_tpu(monkeypatch, B, T, H, G, D, window):
    """The rung's forward and backward through Pallas's TPU lowering (Mosaic), bf16, packed:
    the forward kernel (saving its log-sum-exp), dq and dk/dv."""
    monkeypatch.setattr(attention_module, "backend", lambda: "tpu")
    q = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, T, G, D), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def loss(q, k, v, segment_ids):
        out = ops.attention(q, k, v, window=window, segment_ids=segment_ids,
                            implementation="splash")
        return jnp.sum(out.astype(jnp.float32))

    text = lower_for_tpu(jax.grad(loss, argnums=(0, 1, 2)), q, kv, kv, ids)
    assert text.count("tpu_custom_call") == 3, text.count("tpu_custom_call")


@pytest.mark.parametrize("grads", [pytest.param(False, id="values"),
                                   pytest.param(True, id="grads", marks=pytest.mark.slow)])
def test_on_a_mesh_equals_one_device(splash_on_cpu, grads):
    """`data=2 × tensor=2`: each device runs the kernels on its batch row and heads (GQA's kv
    heads split with them), as on one device."""
    q, k, v = normals(3, (2, 200, 4, 8), (2, 200, 2, 8), (2, 200, 2, 8), dtype=np.float32)
    fn = (_loss("splash", PACKED, 100) if grads else jax.jit(lambda q, k, v: ops.attention(
        q, k, v, window=100, segment_ids=PACKED, implementation="splash")))
    expected = fn(q, k, v)
    with jax.set_mesh(make_mesh(MeshConfig(data=2, tensor=2))):
        assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v))
        got = fn(q, k, v)
    assert_close(got, expected, 1e-5, "on the mesh: outputs" + " and gradients" * grads)
