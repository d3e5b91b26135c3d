"""ops.logits: the LM head's float32 logits, backward in the compute dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import ops
from hybrid_jax.train.loss import mean_loss, token_stats
from tests.helpers import normals, rel_err

VOCAB = 37


def _plain(x, weight, vocab_axis, dtype):
    """The head as written before ops.logits: one product, differentiated by JAX."""
    spec = "btd,vd->btv" if vocab_axis == 0 else "btd,dv->btv"
    return jnp.einsum(spec, x.astype(dtype), weight.astype(dtype),
                      preferred_element_type=jnp.float32)


def _inputs(vocab_axis):
    x, weight, cotangent = normals(0, (2, 5, 16), (VOCAB, 16) if vocab_axis == 0 else
                                   (16, VOCAB), (2, 5, VOCAB), dtype=np.float32)
    return x, weight * 0.1, cotangent


def _value_and_grads(head, x, weight, cotangent):
    loss = lambda x, w: jnp.sum(head(x, w) * cotangent)
    return jax.jit(head)(x, weight), jax.jit(jax.grad(loss, argnums=(0, 1)))(x, weight)


@pytest.mark.parametrize("vocab_axis", [0, 1])
def test_float32_compute_is_the_plain_product(vocab_axis):
    """Float32 compute rounds nothing: the logits are the plain product's bit for bit, and the
    gradients equal autodiff's to float32 summation order (XLA:CPU may sum the custom VJP's
    weight gradient in another order than autodiff's transposed product: 1-ulp differences
    on some host CPUs; a bf16 rounding anywhere would be ~1e-3)."""
    x, weight, cotangent = _inputs(vocab_axis)
    ours = _value_and_grads(lambda x, w: ops.logits(x, w, vocab_axis=vocab_axis,
                                                    dtype=jnp.float32), x, weight, cotangent)
    plain = _value_and_grads(lambda x, w: _plain(x, w, vocab_axis, jnp.float32), x, weight,
                             cotangent)
    np.testing.assert_array_equal(np.asarray(ours[0]), np.asarray(plain[0]))
    for got, want in zip(jax.tree.leaves(ours[1]), jax.tree.leaves(plain[1]), strict=True):
        assert got.dtype == want.dtype == jnp.float32
        assert rel_err(got, want) < 1e-6, rel_err(got, want)


@pytest.mark.parametrize("vocab_axis", [0, 1])
def test_bf16_compute_gradients_within_bf16_rounding(vocab_axis):
    x, weight, cotangent = _inputs(vocab_axis)
    (out, (dx, dw)) = _value_and_grads(
        lambda x, w: ops.logits(x, w, vocab_axis=vocab_axis, dtype=jnp.bfloat16), x, weight,
        cotangent)
    plain_out, (plain_dx, plain_dw) = _value_and_grads(
        lambda x, w: _plain(x, w, vocab_axis, jnp.bfloat16), x, weight, cotangent)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain_out))
    assert out.dtype == jnp.float32 and dx.dtype == x.dtype and dw.dtype == weight.dtype
    # The cotangent rounded to bf16 (2⁻⁹ relative) is the whole difference.
    assert 0 < rel_err(dx, plain_dx) < 1e-2 and 0 < rel_err(dw, plain_dw) < 1e-2


def _dot_generals(jaxpr):
    """(operand dtypes, operand shapes) of every dot_general, sub-jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((tuple(str(v.aval.dtype) for v in eqn.invars),
                          tuple(v.aval.shape for v in eqn.invars)))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    found += _dot_generals(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    found += _dot_generals(sub)
    return found


def _grad_dots(loss, *args):
    return _dot_generals(jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(len(args)))))(
        *args).jaxpr)


@pytest.mark.parametrize("vocab_axis", [0, 1])
def test_backward_products_in_bf16_where_the_plain_ones_mix_float32(vocab_axis):
    x, weight, cotangent = _inputs(vocab_axis)
    x = x.astype(jnp.bfloat16)
    ours = _grad_dots(lambda x, w: jnp.sum(ops.logits(x, w, vocab_axis=vocab_axis,
                                                      dtype=jnp.bfloat16) * cotangent), x, weight)
    plain = _grad_dots(lambda x, w: jnp.sum(_plain(x, w, vocab_axis, jnp.bfloat16) * cotangent),
                       x, weight)
    assert [d for d, _ in ours] == [("bfloat16", "bfloat16")] * 3  # forward, dx, dW
    mixed = [d for d, _ in plain if len(set(d)) > 1]
    assert len(plain) == 3 and len(mixed) == 2, plain  # both backward products mix float32


@pytest.mark.parametrize("tied", [True, False])
def test_model_backward_has_no_float32_by_bf16_head_product(tied):
    config = hj.presets.get("transformer-tiny").replace(vocab_size=VOCAB, dtype="bfloat16",
                                                        tie_embeddings=tied)
    model = nnx.eval_shape(lambda: hj.LanguageModel(config, rngs=nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.zeros((2, 8), jnp.int32)

    def loss(params):
        logits = nnx.merge(graphdef, params, rest)(tokens)
        return mean_loss(token_stats(logits, tokens, jnp.ones(tokens.shape, bool)))

    head = [d for d in _grad_dots(loss, params) if any(VOCAB in shape for shape in d[1])]
    assert [d for d, _ in head] == [("bfloat16", "bfloat16")] * 3, head


def test_refuses_mismatched_shapes():
    x, weight, _ = _inputs(0)
    with pytest.raises(ValueError, match="vocab_axis 0 or 1"):
        ops.logits(x, weight, vocab_axis=2, dtype=jnp.float32)
    with pytest.raises(ValueError, match="model axis"):
        ops.logits(x, weight, vocab_axis=1, dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"expected x \[\.\.\., D\].* got x shape \(\)"):
        ops.logits(x[0, 0, 0], weight, vocab_axis=0, dtype=jnp.float32)  # was an IndexError


def test_refuses_integer_operands_and_dtype():
    """Cast to an integer dtype, x and W were truncated: logits of garbage, silently."""
    x, weight, _ = _inputs(0)
    with pytest.raises(ValueError, match="logits: dtype must be a floating-point dtype, got int8"):
        ops.logits(x, weight, vocab_axis=0, dtype=jnp.int8)
    with pytest.raises(ValueError, match="logits: x must be a floating-point array, got dtype "
                                         "int32"):
        ops.logits(x.astype(jnp.int32), weight, vocab_axis=0, dtype=jnp.float32)
