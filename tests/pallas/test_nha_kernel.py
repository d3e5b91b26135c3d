"""NHA Pallas kernels (GPU and TPU versions, interpret mode on CPU) against float64 references.

Values against a numpy per-token loop of the equations (DESIGN.md, system 1) written here;
gradients of every input against `jax.grad` of `reference.nha_reference` (a per-token
`lax.scan`) in float64, itself checked against the numpy loop.
Tiny tiles (chunk 8) so that small T spans several chunks and key blocks. Interpret mode
compiles slowly on CPU: the default run checks one GPU-kernel configuration with gradients and
one TPU-kernel configuration by value (about 1.5 min); `pytest -m slow` runs the rest (every
window case, GQA, sink mode, strong gates, TPU gradients).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.nha import api
from pallas_kernels.nha.block_sizes import BlockSizes
from pallas_kernels.nha.reference import nha_reference
from tests.helpers import assert_close, normals

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
    loss = lambda x: jnp.sum(fn(x) * weights)
    return jax.jit(lambda x: (fn(x), jax.grad(loss)(x)))(x)


def check(x, window, empty_slots, backend="gpu", grads=True, blocks=TINY):
    scale = 0.5
    out = kernel_nha(x, window, scale, empty_slots, backend, blocks)
    assert_close(out, numpy_nha(x, window, scale, empty_slots), 1e-5, "values vs numpy")
    if not grads:
        return
    weights = normals(7, out.shape, dtype=np.float32)
    _, kernel_grads = value_and_grads(
        lambda x: kernel_nha(x, window, scale, empty_slots, backend, blocks), x, weights)
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


def test_op_pallas_rung_takes_plain_calls_only():
    """`hybrid_jax.ops.native_hybrid_attention(implementation="pallas")` names why it cannot run:
    packed documents (and, on this CPU, no kernel platform)."""
    from hybrid_jax.ops.nha import native_hybrid_attention

    x = make_inputs(8, 1, 8, 2, 2)
    args = [x[n] for n in NAMES[:5]]
    segments = jnp.zeros((1, 8), jnp.int32)
    for options, message in ((dict(segment_ids=segments), "segment_ids"), ({}, "platform")):
        with pytest.raises(ValueError, match=message):
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


@pytest.mark.slow
@pytest.mark.parametrize(("window", "dtype"), [(0, jnp.bfloat16), (16, jnp.bfloat16),
                                               (0, jnp.float16)])
def test_gpu_kernel_16bit_slot_precisions(window, dtype):
    """16-bit inputs: the "float32" and (default) "mixed" slot precisions stay within 16-bit
    rounding (2 %) of the float64 reference, values and gradients, with all the softmax mass on
    the slots (w = 0) too; "mixed" does round some gradient products (it differs)."""
    x = {n: a.astype(dtype) for n, a in make_inputs(5, 1, 37, 2, 2).items()}
    weights = normals(7, (1, 37, 2, 8), dtype=np.float32)
    with jax.enable_x64(True):
        x64 = {n: jnp.asarray(a, jnp.float64) for n, a in x.items()}
        ref_out, ref_grads = value_and_grads(lambda x: scan_nha(x, window, 0.5, "mask"), x64,
                                             jnp.asarray(weights, jnp.float64))
    grads = {}
    for precision in ("float32", "mixed"):
        blocks = dataclasses.replace(TINY, slot_precision=precision)
        out, grads[precision] = value_and_grads(
            lambda x, blocks=blocks: kernel_nha(x, window, 0.5, "mask", blocks=blocks
                                                ).astype(jnp.float32), x, weights)
        assert_close(out, ref_out, 2e-2, f"{precision} values")
        for name in NAMES:
            assert_close(grads[precision][name], ref_grads[name], 2e-2, f"{precision} d{name}")
    assert any(not np.array_equal(grads["float32"][n], grads["mixed"][n]) for n in ("q", "k"))
