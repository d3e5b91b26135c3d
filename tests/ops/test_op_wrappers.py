"""The op wrappers' own contracts, beside their kernels' tests: `ops.short_conv`,
`ops.logits` and the norms refuse bad inputs by name (dtypes, empty taps, bad group sizes, a
weight of another rank) and return the documented dtypes on their XLA rungs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops


def _raises(message: str):
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


def test_short_conv_refuses_no_taps_and_non_integer_ids_and_bias():
    x, w = jnp.zeros((2, 8, 5)), jnp.zeros((4, 5))
    with _raises("short_conv: weight needs at least one tap, got shape (0, 5)"):
        ops.short_conv(x, jnp.zeros((0, 5)))
    with _raises("short_conv: segment_ids must be integers, got dtype float32"):
        ops.short_conv(x, w, segment_ids=jnp.zeros((2, 8)))
    with _raises("short_conv: bias must be a floating-point array, got dtype int32"):
        ops.short_conv(x, w, jnp.zeros(5, jnp.int32))
    with _raises("short_conv: axis C of bias (shape (4,), layout [C]) is 4, but x "
                 "(shape (2, 8, 5)) says 5"):
        ops.short_conv(x, w, jnp.zeros(4))


def test_short_conv_keeps_x_dtype_and_reads_every_tap():
    """bf16 in, bf16 out (float32 inside); y_t = Σ_i w_i x_{t−i} with zeros before the row."""
    x = jnp.arange(1.0, 7.0).reshape(1, 6, 1)
    w = jnp.asarray([[1.0], [2.0], [4.0]])
    y = ops.short_conv(x.astype(jnp.bfloat16), w, implementation="xla")
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32)[0, :, 0],
                                  [1, 4, 11, 18, 25, 32])


def test_logits_refuses_a_weight_of_another_rank_by_name():
    x = jnp.zeros((2, 3, 4))
    with _raises("logits: expected x [..., D], a 2-D weight and vocab_axis 0 or 1, got x shape "
                 "(2, 3, 4), weight shape (4, 5, 6) and vocab_axis 1"):
        ops.logits(x, jnp.zeros((4, 5, 6)), vocab_axis=1, dtype=jnp.float32)
    with _raises("logits: expected x [..., D], a 2-D weight and vocab_axis 0 or 1, got x shape "
                 "(2, 3, 4), weight shape (4,) and vocab_axis 0"):
        ops.logits(x, jnp.zeros(4), vocab_axis=0, dtype=jnp.float32)
    with _raises("logits: x's last axis 4 must equal the weight's model axis, weight shape "
                 "(5, 7) (vocab_axis 1)"):
        ops.logits(x, jnp.zeros((5, 7)), vocab_axis=1, dtype=jnp.float32)


@pytest.mark.parametrize("vocab_axis", [0, 1])
def test_logits_gradients_come_back_in_each_inputs_dtype(vocab_axis):
    """A bf16 x with a float32 table (and the reverse): dx in x's dtype, dW in W's."""
    x = jnp.ones((2, 3, 4))
    w = jnp.ones((5, 4) if vocab_axis == 0 else (4, 5))
    for x_dtype, w_dtype in ((jnp.bfloat16, jnp.float32), (jnp.float32, jnp.bfloat16)):
        grads = jax.grad(lambda x, w: jnp.sum(ops.logits(x, w, vocab_axis=vocab_axis,
                                                         dtype=jnp.bfloat16)),
                         argnums=(0, 1))(x.astype(x_dtype), w.astype(w_dtype))
        assert (grads[0].dtype, grads[1].dtype) == (x_dtype, w_dtype)
        np.testing.assert_array_equal(np.asarray(grads[0], np.float32), 5.0)
        np.testing.assert_array_equal(np.asarray(grads[1], np.float32), 6.0)


@pytest.mark.parametrize("group_size", [0, -4])
def test_norm_refuses_group_sizes_below_one(group_size):
    x = jnp.zeros((2, 8))
    with _raises(f"gated_rms_norm: group_size must be an int >= 1, got {group_size}"):
        ops.gated_rms_norm(x, x, jnp.ones(8), group_size=group_size)


def test_norm_refuses_an_integer_scale_and_a_gate_of_another_shape():
    x = jnp.zeros((2, 8))
    with _raises("rms_norm: scale must be a floating-point array, got dtype int32"):
        ops.rms_norm(x, jnp.ones(8, jnp.int32))
    with _raises("gated_rms_norm: z must have x's shape (2, 8), got (1, 8)"):
        ops.gated_rms_norm(x, jnp.zeros((1, 8)), jnp.ones(8))


def test_norm_output_dtype_defaults_to_x_and_eps_is_used():
    x = jnp.full((1, 4), 2.0, jnp.bfloat16)
    y = ops.rms_norm(x, jnp.ones(4), implementation="xla")
    assert y.dtype == jnp.bfloat16
    assert ops.rms_norm(x, jnp.ones(4), dtype=jnp.float32).dtype == jnp.float32
    # n(x) = 2 / √(4 + ε): ε = 12 gives 0.5.
    np.testing.assert_allclose(np.asarray(ops.rms_norm(x.astype(jnp.float32), jnp.ones(4),
                                                       eps=12.0)), 0.5, rtol=1e-6)
