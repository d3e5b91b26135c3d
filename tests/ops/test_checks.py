"""The ops' input checks (`hybrid_jax.ops.checks`): each error names the op, the argument, what
was expected and what was found, in full; the op-level tests match only a fragment of them."""

import re

import jax.numpy as jnp
import pytest

from hybrid_jax import ops
from hybrid_jax.ops import checks
from hybrid_jax.ops.segments import document_starts


def _raises(message: str):
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


def test_rank_error_gives_layout_rank_and_shape():
    with _raises("op: q must have shape [B,T,H,D] (rank 4), got shape (2, 3)"):
        checks.check_rank("op", "q", jnp.zeros((2, 3)), "BTHD")
    with _raises("op: q must have shape [B,T] (rank 2), got shape (2, 3, 1)"):
        checks.check_rank("op", "q", jnp.zeros((2, 3, 1)), "BT")


def test_dims_error_names_where_the_size_came_from():
    a = jnp.zeros((2, 4))
    with _raises("op: axis T of a (shape (2, 4), layout [B,T]) is 4, but given says 5"):
        checks.check_dims("op", {"T": 5}, a=(a, "BT"))
    # The first array that set a size is named, not a later one that agreed with it.
    with _raises("op: axis T of v (shape (2, 4), layout [B,T]) is 4, but q (shape (2, 3)) "
                 "says 3"):
        checks.check_dims("op", {}, q=(jnp.zeros((2, 3)), "BT"), k=(jnp.zeros((2, 3)), "BT"),
                          v=(a, "BT"))
    with _raises("op: axis B of b (shape (2, 4), layout [B,T]) is 2, but given says 3"):
        checks.check_dims("op", {"B": 3, "T": 4}, b=(a, "BT"))


def test_dims_returns_every_size_and_leaves_underscore_axes_free():
    sizes = checks.check_dims("op", {"H": 7}, a=(jnp.zeros((2, 3)), "B_"),
                              b=(jnp.zeros((2, 5, 4)), "B_T"))
    assert sizes == {"H": 7, "B": 2, "T": 4}


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.complex64])
def test_floating_refuses_integers_booleans_and_complex(dtype):
    with _raises(f"op: x must be a floating-point array, got dtype {jnp.dtype(dtype)}"):
        checks.check_floating("op", y=jnp.zeros(2), x=jnp.zeros(2, dtype), z=None)
    checks.check_floating("op", x=jnp.zeros(2, jnp.bfloat16), y=None)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bool_])
def test_integer_refuses_floats_and_booleans(dtype):
    with _raises(f"op: ids must be integers, got dtype {jnp.dtype(dtype)}"):
        checks.check_integer("op", ids=jnp.zeros(2, dtype))
    checks.check_integer("op", ids=jnp.zeros(2, jnp.uint8), other=None)


def test_divides_and_choice_messages():
    with _raises("op: heads: 0 does not divide 4"):
        checks.check_divides("op", "heads", 0, 4)
    with _raises("op: heads: 3 does not divide 4"):
        checks.check_divides("op", "heads", 3, 4)
    checks.check_divides("op", "heads", 2, 4)
    with _raises("op: mode=None is not one of ['a', 'b']"):
        checks.check_choice("op", "mode", None, ("a", "b"))
    checks.check_choice("op", "mode", "b", ("a", "b"))


def _ssm(**change):
    arrays = dict(x=jnp.zeros((1, 3, 4, 2)), dt=jnp.zeros((1, 3, 4)), A=jnp.zeros(4),
                  B=jnp.zeros((1, 3, 2, 5)), C=jnp.zeros((1, 3, 2, 5)), chunk_size=2,
                  initial_state=jnp.zeros((1, 4, 2, 5)))
    arrays.update(change)
    return arrays


@pytest.mark.parametrize("change, message", [
    (dict(initial_state=jnp.zeros((1, 4, 2, 5), jnp.int32)),
     "op: initial_state must be a floating-point array, got dtype int32"),
    (dict(A=jnp.zeros(4, jnp.int32)), "op: A must be a floating-point array, got dtype int32"),
    (dict(initial_state=jnp.zeros((1, 4, 3, 5))),
     "op: axis P of initial_state (shape (1, 4, 3, 5), layout [B,H,P,N]) is 3, but x "
     "(shape (1, 3, 4, 2)) says 2"),
    (dict(initial_state=jnp.zeros((2, 4, 2, 5))),
     "op: axis B of initial_state (shape (2, 4, 2, 5), layout [B,H,P,N]) is 2, but x "
     "(shape (1, 3, 4, 2)) says 1"),
])
def test_ssm_inputs_check_the_initial_state_and_A(change, message):
    checks.check_ssm_inputs("op", **_ssm(), dt_layout="BTH", A_layout="H")
    with _raises(message):
        checks.check_ssm_inputs("op", **_ssm(**change), dt_layout="BTH", A_layout="H")


def test_segment_ids_of_another_batch_are_refused():
    """One row of ids for two rows of inputs would broadcast: refused, in the op as well."""
    with _raises("op: axis B of segment_ids (shape (1, 5), layout [B,T]) is 1, but given "
                 "says 2"):
        document_starts("op", jnp.zeros((1, 5), jnp.int32), 2, 5)
    with _raises("op: segment_ids must be integers, got dtype bool"):
        document_starts("op", jnp.zeros((2, 5), bool), 2, 5)
    assert document_starts("op", None, 2, 5) is None
    x, dt = jnp.zeros((2, 5, 2, 3)), jnp.ones((2, 5, 2))
    b = jnp.zeros((2, 5, 1, 4))
    with pytest.raises(ValueError, match=r"axis B of segment_ids .* is 1, but given says 2"):
        ops.ssd(x, dt, -jnp.ones(2), b, b, segment_ids=jnp.zeros((1, 5), jnp.int32))


def test_ops_name_the_array_a_size_came_from_in_later_checks():
    """A second `check_dims` call given the first one's sizes names the array each came from,
    not "given" (before: "but given says 5" for a size that only q had given)."""
    q = jnp.zeros((1, 5, 2, 4))
    with _raises("attention: axis T of segment_ids (shape (1, 4), layout [B,T]) is 4, but q "
                 "(shape (1, 5, 2, 4)) says 5"):
        ops.attention(q, q, q, segment_ids=jnp.zeros((1, 4), jnp.int32))
    g = jnp.zeros((1, 5, 2))
    with _raises("gated_delta_rule: axis V of initial_state (shape (1, 2, 4, 3), layout "
                 "[B,H,K,V]) is 3, but v (shape (1, 5, 2, 4)) says 4"):
        ops.gated_delta_rule(q, q, q, g, g, initial_state=jnp.zeros((1, 2, 4, 3)))
