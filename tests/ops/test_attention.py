"""attention / RoPE / scaled-cosine attention against independent float64 numpy definitions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from hybrid_jax.ops.attention import masked_softmax
from tests.helpers import assert_close, normals


def numpy_attention(q, k, v, *, causal, window, scale, segment_ids=None):
    """Loops over every (batch, head, query): the plainest statement of the window convention."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, T, Hq, _ = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    out = np.zeros((B, T, Hq, v.shape[-1]))
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            for t in range(T):
                tp = t + S - T
                keys = []
                for s in range(S):
                    if causal and s > tp:
                        continue
                    if window is not None and tp - s >= window:
                        continue
                    if window is not None and not causal and s - tp >= window:
                        continue
                    if segment_ids is not None and segment_ids[b, s] != segment_ids[b, t]:
                        continue
                    keys.append(s)
                if not keys:
                    continue
                logits = np.array([scale * q[b, t, h] @ k[b, s, kh] for s in keys])
                p = np.exp(logits - logits.max())
                p /= p.sum()
                out[b, t, h] = sum(pi * v[b, s, kh] for pi, s in zip(p, keys, strict=True))
    return out


def _qkv(T, S, Hq, Hkv, D=8, Dv=6, B=2, dtype=jnp.float64, seed=0):
    return normals(seed, (B, T, Hq, D), (B, S, Hkv, D), (B, S, Hkv, Dv), dtype=dtype)


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [1, 7, 13])
def test_attention_matches_numpy_all_windows(x64, impl, causal, T):
    q, k, v = _qkv(T, T, Hq=4, Hkv=2)
    for window in [None, *range(1, T + 1), T + 5]:
        out = ops.attention(q, k, v, causal=causal, window=window, implementation=impl)
        ref = numpy_attention(q, k, v, causal=causal, window=window, scale=8**-0.5)
        assert_close(out, ref, 1e-12, f"{impl} causal={causal} window={window}")


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_attention_fewer_queries_than_keys_and_segments(x64, impl):
    q, k, v = _qkv(3, 11, Hq=6, Hkv=3)
    out = ops.attention(q, k, v, causal=True, window=4, scale=0.3, implementation=impl)
    assert_close(out, numpy_attention(q, k, v, causal=True, window=4, scale=0.3), 1e-12)
    q, k, v = _qkv(9, 9, Hq=2, Hkv=1)
    seg = jnp.array([[0, 0, 0, 1, 1, 2, 2, 2, 2], [5, 5, 5, 5, 5, 5, 6, 6, 6]])
    out = ops.attention(q, k, v, segment_ids=seg, implementation=impl)
    assert_close(out, numpy_attention(q, k, v, causal=True, window=None, scale=8**-0.5,
                                      segment_ids=np.asarray(seg)), 1e-12)


def test_xla_gradients_match_reference(x64):
    q, k, v = _qkv(10, 10, Hq=4, Hkv=2)

    def loss(impl):
        return lambda *a: jnp.sum(jnp.sin(ops.attention(*a, window=3, implementation=impl)))

    g_ref = jax.jit(jax.grad(loss("reference"), argnums=(0, 1, 2)))(q, k, v)
    g_xla = jax.jit(jax.grad(loss("xla"), argnums=(0, 1, 2)))(q, k, v)
    assert_close(g_xla, g_ref, 1e-12, "grads")


def test_positions_and_empty_slots_match_plain_call(x64):
    """A ring-buffer style call (shuffled key slots with explicit positions) gives the same."""
    q, k, v = _qkv(4, 12, Hq=2, Hkv=2)
    full = ops.attention(q, k, v, window=5)
    perm = jnp.array([3, 0, 11, 7, 1, 2, 10, 4, 9, 5, 6, 8])
    k_pos = jnp.where(perm < 4, -1, perm)  # slots holding keys 0..3 are "empty" (outside window)
    out = ops.attention(q, k[:, perm], v[:, perm], window=5, q_positions=jnp.arange(8, 12),
                        kv_positions=k_pos)
    assert_close(out, full, 1e-12)


def test_bf16_output_dtype_and_accuracy():
    q, k, v = _qkv(16, 16, Hq=4, Hkv=1, D=16, Dv=16, dtype=jnp.float32)
    ref = ops.attention(q, k, v, implementation="reference")
    out = ops.attention(*(a.astype(jnp.bfloat16) for a in (q, k, v)), implementation="xla")
    assert out.dtype == jnp.bfloat16
    assert_close(out.astype(jnp.float32), ref, 2e-2)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_active_queries_zero_the_other_rows(x64, impl):
    """Inactive rows are 0; active ones are the plain attention's (numpy), gradients only
    through them."""
    q, k, v = _qkv(9, 9, Hq=4, Hkv=2)
    seg = jnp.array([[0, 0, 0, 1, 1, 2, 2, 2, 2], [5] * 9])
    active = jnp.array([[1, 1, 0, 0, 1, 0, 1, 1, 0], [0] * 4 + [1] * 5], bool)
    out = ops.attention(q, k, v, window=4, segment_ids=seg, active_queries=active,
                        implementation=impl)
    ref = numpy_attention(q, k, v, causal=True, window=4, scale=8**-0.5,
                          segment_ids=np.asarray(seg))
    assert_close(out, np.where(np.asarray(active)[:, :, None, None], ref, 0.0), 1e-12, impl)
    dq = jax.grad(lambda q: jnp.sum(ops.attention(q, k, v, active_queries=active,
                                                  implementation=impl)))(q)
    mask = np.asarray(active)
    assert np.all(np.asarray(dq)[~mask] == 0) and np.all(np.asarray(dq)[mask][1:] != 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(window=0), "window must be an int >= 1 or None, got 0"),
        (dict(window=2.5), "window must be an int >= 1 or None, got 2.5"),
        (dict(window=True), "window must be an int >= 1 or None, got True"),
        (dict(segment_ids=jnp.zeros((1, 4))), "segment_ids must be integers, got dtype float32"),
        (dict(q_positions=jnp.arange(4.0)), "q_positions must be integers"),
        (dict(kv_positions=jnp.arange(4.0)), "kv_positions must be integers"),
        (dict(segment_ids=jnp.zeros((1, 4), int), kv_segment_ids=jnp.zeros((1, 4))),
         "kv_segment_ids must be integers"),
        (dict(implementation="triton"), "implementation='triton' is not available"),
        (dict(implementation="pallas"), "pallas.*needs a GPU backend"),
        (dict(implementation="cudnn"), "needs a GPU backend"),
        (dict(implementation="splash"), "splash.*needs a TPU backend"),
        (dict(active_queries=jnp.ones((2, 4), int)), "active_queries must be bool"),
        (dict(active_queries=jnp.ones((2, 3), bool)), "axis T of active_queries"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    q, k, v = _qkv(4, 4, Hq=2, Hkv=1, dtype=jnp.float32)
    with pytest.raises(ValueError, match=message):
        ops.attention(q, k, v, **kwargs)


def test_bad_shapes_are_named():
    q, k, v = _qkv(4, 4, Hq=3, Hkv=2, dtype=jnp.float32)
    with pytest.raises(ValueError, match="num_kv_heads .* must divide num_heads"):
        ops.attention(q, k, v)
    with pytest.raises(ValueError, match=r"q must have shape \[B,T,H,D\]"):
        ops.attention(q[0], k, v)
    q, k, v = _qkv(4, 5, Hq=2, Hkv=2, dtype=jnp.float32)
    with pytest.raises(ValueError, match="axis S of v"):
        ops.attention(q, k, v[:, :4])


def numpy_rope(x, positions, theta, fraction):
    x = np.asarray(x, np.float64)
    D = x.shape[-1]
    r = int(D * fraction) // 2 * 2
    out = x.copy()
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for i in range(r // 2):
                angle = positions[t] * theta ** (-2 * i / r)
                c, s = np.cos(angle), np.sin(angle)
                a, bb = x[b, t, :, i], x[b, t, :, i + r // 2]
                out[b, t, :, i] = a * c - bb * s
                out[b, t, :, i + r // 2] = bb * c + a * s
    return out


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25, 0.0])
def test_rope_matches_numpy(fraction):
    x = normals(1, (2, 5, 3, 16), dtype=jnp.float32)
    pos = jnp.array([0, 3, 4, 9, 100])
    out = ops.apply_rope(x, pos, theta=500.0, fraction=fraction)
    assert_close(out, numpy_rope(x, np.asarray(pos), 500.0, fraction), 1e-5)


@pytest.mark.parametrize(("fraction", "dtype"), [(1.0, jnp.float32), (0.5, jnp.float32),
                                             (1.0, jnp.bfloat16)])
def test_rope_gradient_is_the_inverse_rotation(fraction, dtype):
    """RoPE is x ↦ R x, so ∂⟨w, R x⟩/∂x = Rᵀ w: w rotated by the opposite angles (the numpy
    rotation at negated positions), channels past the rotary ones passed through; [B, T]
    positions, the gradient in x's dtype."""
    x, w = normals(3, (2, 5, 3, 16), (2, 5, 3, 16), dtype=jnp.float32)
    pos = jnp.array([0, 3, 4, 9, 100])
    grad = jax.grad(lambda x: jnp.sum(ops.apply_rope(
        x, jnp.stack([pos, pos]), theta=500.0, fraction=fraction).astype(jnp.float32) * w))(
            x.astype(dtype))
    assert grad.dtype == dtype
    assert_close(grad.astype(jnp.float32), numpy_rope(w, -np.asarray(pos), 500.0, fraction),
                 1e-5 if dtype == jnp.float32 else 1e-2)


@pytest.mark.parametrize("scaling", [(8.0, 1.0, 4.0), (0.0, 1.0, 4.0, 8192), (8.0, 0.0, 4.0, 8192),
                                     (8.0, 4.0, 1.0, 8192), (8.0, 1.0, 4.0, -1),
                                     (8.0, 1.0, float("nan"), 8192), (8.0, True, 4.0, 8192)])
def test_rope_refuses_a_scaling_it_cannot_divide_by(scaling):
    """The op's own check is the config's rule: every value it divides by, not only high > low
    (a zero factor gave infinite frequencies)."""
    with pytest.raises(ValueError, match=r"rope scaling .*: expected None or \(factor, "):
        ops.apply_rope(jnp.ones((1, 2, 1, 8)), jnp.arange(2), scaling=scaling)


def test_rope_is_relative():
    """Rotated dot products depend only on position differences."""
    q, k = normals(2, (1, 1, 1, 8), (1, 1, 1, 8), dtype=jnp.float32)
    dots = [jnp.sum(ops.apply_rope(q, jnp.array([p + 7])) * ops.apply_rope(k, jnp.array([p])))
            for p in (0, 5, 40)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-5)


def test_scaled_cosine_attention(x64):
    q, k, v = _qkv(6, 6, Hq=2, Hkv=1)
    tau = jnp.array([np.log(10.0), 7.0])  # second head is clipped at log(100)
    out = ops.scaled_cosine_attention(q, k, v, tau, causal=True)
    qn = np.asarray(q) / np.linalg.norm(np.asarray(q), axis=-1, keepdims=True)
    kn = np.asarray(k) / np.linalg.norm(np.asarray(k), axis=-1, keepdims=True)
    ref = np.concatenate([
        numpy_attention(qn[:, :, h:h + 1], kn, v, causal=True, window=None, scale=s)
        for h, s in enumerate([10.0, 100.0])
    ], axis=2)
    assert_close(out, ref, 1e-6)  # l2_normalize's eps (1e-6 under the root) moves the 7th digit
    with pytest.raises(ValueError, match="do not pass scale"):
        ops.scaled_cosine_attention(q, k, v, tau, scale=1.0)


def test_masked_softmax_gives_rows_without_keys_zeros():
    """A query with no visible key (an empty cache slot row, a fully masked row) gets zero
    weights and a zero gradient, never NaN; the other rows are softmaxes over their keys."""
    logits = jnp.asarray(normals(5, (2, 3, 4), dtype=np.float32))
    mask = jnp.asarray(np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], bool))[None]
    weights = np.asarray(masked_softmax(logits, mask))
    assert (weights[:, 1] == 0).all() and (weights[:, 2] == [1, 0, 0, 0]).all()
    np.testing.assert_allclose(weights[:, 0].sum(-1), 1.0, rtol=1e-6)
    grad = jax.grad(lambda l: jnp.sum(masked_softmax(l, mask) * jnp.arange(4.0)))(logits)
    assert np.isfinite(np.asarray(grad)).all() and not np.asarray(grad)[:, 1].any()


def test_no_queries_or_no_keys_are_refused_by_name():
    q, k, v = _qkv(4, 4, Hq=2, Hkv=1, dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"at least one query and one key, got q shape \(2, 0"):
        ops.attention(q[:, :0], k, v, causal=False)
    with pytest.raises(ValueError, match=r"and k shape \(2, 0, 1, 8\)"):
        ops.attention(q, k[:, :0], v[:, :0], causal=False)


def test_attention_positions_of_another_length_are_refused_by_name():
    q, k, v = _qkv(4, 6, Hq=2, Hkv=1, dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"attention: q_positions must have shape \[T\] = \[4\] "
                                         r"or \[B,T\] = \[2, 4\], got \(5,\)"):
        ops.attention(q, k, v, causal=False, q_positions=jnp.arange(5))
    with pytest.raises(ValueError, match=r"kv_positions must have shape \[S\] = \[6\] or "
                                         r"\[B,S\] = \[2, 6\], got \(3, 6\)"):
        ops.attention(q, k, v, causal=False, kv_positions=jnp.zeros((3, 6), int))


@pytest.mark.parametrize("call, message", [
    (lambda: ops.apply_rope(jnp.ones((1, 2, 1, 4), jnp.int32), jnp.arange(2)),
     "apply_rope: x must be a floating-point array, got dtype int32"),  # came back rounded
    (lambda: ops.apply_rope(jnp.ones((1, 2, 1, 4)), jnp.arange(2) + 0.5),
     "apply_rope: positions must be integers, got dtype float32"),  # rotated fractionally
    (lambda: ops.attention_mask(1, 2, 2, causal=True, window=0),
     "attention_mask: window must be an int >= 1 or None, got 0"),  # masked every key
    (lambda: ops.apply_rope(jnp.ones((1, 2, 1, 4)), jnp.arange(2), theta=-1.0),
     "rope theta must be a finite number > 0, got -1.0"),  # NaN angles
])
def test_rope_and_mask_refuse_what_they_would_get_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_rope_positions_of_another_length_are_refused_by_name():
    q, _, _ = _qkv(4, 4, Hq=2, Hkv=1, dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"positions must have shape \[T\] = \[4\] or \[B,T\] = "
                                         r"\[2, 4\] .* got \(5,\)"):
        ops.apply_rope(q, jnp.arange(5))
    with pytest.raises(ValueError, match=r"got \(3, 4\)"):
        ops.apply_rope(q, jnp.zeros((3, 4), int))
    per_row = jnp.tile(jnp.arange(4), (2, 1))
    assert_close(ops.apply_rope(q, jnp.arange(4)), ops.apply_rope(q, per_row), 1e-15)
