"""Packed documents in every recurrence op: the chunked rung equals the per-token reference
(values and gradients) with `segment_ids`, and a packed document equals the document run alone.

The references reset their state literally (`segments.reset_state`), the chunked rungs through
the decay, so agreement checks one against the other. NHA's own segment tests are in
test_nha.py (its windows need more than a state reset).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from hybrid_jax.ops.segments import document_starts
from hybrid_jax.ops.selective_scan import selective_scan
from tests.helpers import assert_close, normals

B, T, H, K = 2, 11, 2, 3  # odd length: chunks of 4 leave a partial one
CUT = 5  # row 0 holds two documents [0, 5) and [5, 11); row 1 one document
SEGMENTS = np.array([[0] * CUT + [1] * (T - CUT), [3] * T])


def _ssd(seed):
    x, dt, a, b, c = normals(seed, (B, T, H, K), (B, T, H), (H,), (B, T, 1, 4), (B, T, 1, 4))
    return ops.ssd, (x, 0.5 * jax.nn.softplus(dt), -jnp.exp(0.5 * a), b, c), dict(chunk_size=4)


def _selective_scan(seed):
    x, dt, a, b, c = normals(seed, (B, T, H, K), (B, T, H, K), (H, K, 4), (B, T, 1, 4),
                             (B, T, 1, 4))
    return selective_scan, (x, 0.5 * jax.nn.softplus(dt), -jnp.exp(0.5 * a), b, c), dict(
        chunk_size=4)


def _delta_rule(seed):
    q, k, v, g, beta = normals(seed, (B, T, H, K), (B, T, H, K), (B, T, H, 2), (B, T, H),
                               (B, T, H))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    return ops.gated_delta_rule, (q, k, v, jax.nn.log_sigmoid(g), jax.nn.sigmoid(beta)), dict(
        chunk_size=4)


def _gsa(seed):
    q, k, v, f = normals(seed, (B, T, H, K), (B, T, H, K), (B, T, H, 2), (B, T, H, 4))
    g = jax.nn.log_sigmoid(f) / 8
    return ops.gated_slot_attention, (q, k, v, -jnp.expm1(g), g), dict(chunk_size=4)


def _dss(seed):
    u, log_dt, re, im, w_re, w_im = normals(seed, (B, T, H), (H,), (4,), (4,), (H, 4), (H, 4))
    log_decay, coeff = ops.dss_discretize(0.3 * log_dt - 1, 0.3 * re, jnp.abs(im), w_re, w_im)
    return ops.dss, (u, log_decay, coeff), dict(chunk_size=4)


OPS = {"ssd": (_ssd, "xla"), "selective_scan": (_selective_scan, "xla"),
       "gated_delta_rule": (_delta_rule, "xla"), "gated_slot_attention": (_gsa, "xla"),
       "dss": (_dss, "xla")}


def _float_args(args):
    return [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]


@pytest.mark.parametrize("name", sorted(OPS))
def test_chunked_rung_matches_reference_with_segments(x64, name):
    build, fast = OPS[name]
    op, args, kwargs = build(0)
    seg = jnp.asarray(SEGMENTS)
    weights = normals(1, (B, T) + op(*args, **kwargs).shape[2:])
    wrt = _float_args(args)

    def loss(implementation, *diff):
        full = list(args)
        for i, value in zip(wrt, diff, strict=True):
            full[i] = value
        out = op(*full, segment_ids=seg, implementation=implementation, **kwargs)
        return jnp.sum(out * weights), out

    results = {impl: jax.jit(jax.value_and_grad(lambda *d, impl=impl: loss(impl, *d),
                                                argnums=tuple(range(len(wrt))), has_aux=True))(
        *[args[i] for i in wrt]) for impl in ("reference", fast)}
    (_, ref_out), ref_grads = results["reference"]
    (_, fast_out), fast_grads = results[fast]
    assert_close(fast_out, ref_out, 1e-10, f"{name} values")
    assert_close(fast_grads, ref_grads, 1e-9, f"{name} gradients")


@pytest.mark.parametrize("name", sorted(OPS))
def test_packed_document_equals_document_alone(x64, name):
    """The reference with segment ids restarts at the document start: row 0's second document
    gives what it gives run alone (so the ladder above checks real resets)."""
    op, args, kwargs = OPS[name][0](0)
    packed = op(*args, segment_ids=jnp.asarray(SEGMENTS), implementation="reference", **kwargs)
    alone_args = [a[:1, CUT:] if a.ndim >= 2 and a.shape[:2] == (B, T) else a for a in args]
    alone = op(*alone_args, implementation="reference", **kwargs)
    assert_close(packed[:1, CUT:], alone, 1e-12, name)
    whole = op(*args, implementation="reference", **kwargs)
    assert_close(packed[1], whole[1], 1e-12, f"{name}: a row with one document")
    assert float(jnp.max(jnp.abs(packed[0, CUT:] - whole[0, CUT:]))) > 1e-6, name


def test_document_starts_convention_and_errors(x64):
    starts = document_starts("op", jnp.asarray([[4, 4, 7, 7, 4]]), 1, 5)
    assert starts.tolist() == [[False, False, True, False, True]]  # the first token continues
    with pytest.raises(ValueError, match="segment_ids must be integers"):
        document_starts("op", jnp.zeros((1, 5)), 1, 5)
    with pytest.raises(ValueError, match="axis T of segment_ids"):
        document_starts("op", jnp.zeros((1, 4), jnp.int32), 1, 5)
    with pytest.raises(ValueError, match="a convolution cannot restart"):
        op, args, _ = _dss(0)
        op(*args, segment_ids=jnp.asarray(SEGMENTS), implementation="fft")
