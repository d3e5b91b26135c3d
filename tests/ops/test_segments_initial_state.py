"""Packed documents together with an initial and a final state, in the recurrence ops whose
chunked rung takes all three (test_segments.py runs documents from the zero state, without the
final state): the initial state reaches each row's first document only, the final state is the
last document's, and the chunked rung equals the per-token reference in values (outputs and
final state) and gradients (every float input and the initial state), at an odd length.

DSS has the same checks in test_dss.py, NHA in test_nha.py, the Pallas rungs in tests/pallas.
"""

import jax
import jax.numpy as jnp
import pytest

from tests.helpers import assert_close, normals
from tests.ops.test_segments import CUT, OPS, SEGMENTS, B, H, K, T

# The initial state of each op at test_segments.py's shapes (its `_ssd`, ... builders).
STATE_SHAPES = {"ssd": (B, H, K, 4), "selective_scan": (B, H, K, 4),
                "gated_delta_rule": (B, H, K, 2), "gated_slot_attention": ((B, H, K, 4),
                                                                           (B, H, 4, 2))}
NAMES = sorted(STATE_SHAPES)


def _case(name):
    op, args, kwargs = OPS[name][0](0)
    shapes = STATE_SHAPES[name]
    if isinstance(shapes[0], tuple):
        state = tuple(normals(2, *shapes))
    else:
        state = normals(2, shapes)
    return op, args, kwargs, state


def _rows(args, rows, steps):
    """The `[B, T, ...]` inputs cut to `rows` and `steps`; per-head parameters (A) whole."""
    return [a[rows, steps] if a.ndim >= 2 and a.shape[:2] == (B, T) else a for a in args]


@pytest.mark.parametrize("name", NAMES)
def test_initial_state_reaches_the_first_document_only(x64, name):
    """The reference with segment ids and an initial state: row 0's first document continues
    the state, its second starts from zero and leaves the final state; row 1 (one document)
    continues the state throughout. Each against the documents run alone."""
    op, args, kwargs, state = _case(name)
    run = jax.jit(lambda args, state, seg: op(*args, initial_state=state, segment_ids=seg,
                                              return_final_state=True,
                                              implementation="reference", **kwargs))
    out, final = run(args, state, jnp.asarray(SEGMENTS))
    row = lambda tree, r: jax.tree.map(lambda x: x[r:r + 1], tree)
    alone = jax.jit(lambda args, state: op(*args, initial_state=state, return_final_state=True,
                                           implementation="reference", **kwargs))
    first, _ = alone(_rows(args, slice(0, 1), slice(0, CUT)), row(state, 0))
    second, second_final = alone(_rows(args, slice(0, 1), slice(CUT, T)),
                                 jax.tree.map(jnp.zeros_like, row(state, 0)))
    whole, whole_final = alone(_rows(args, slice(1, 2), slice(0, T)), row(state, 1))
    assert_close(out[:1, :CUT], first, 1e-12, f"{name}: the first document")
    assert_close((out[:1, CUT:], row(final, 0)), (second, second_final), 1e-12,
                 f"{name}: the second document and the final state")
    assert_close((out[1:], row(final, 1)), (whole, whole_final), 1e-12,
                 f"{name}: a row of one document")


@pytest.mark.parametrize("name", NAMES)
def test_chunked_rung_matches_reference_with_segments_and_states(x64, name):
    """Chunks of 4 over T = 11, document starts inside a chunk (5): values of the outputs and
    the final state, gradients of a loss on both w.r.t. every float input and the initial
    state."""
    op, args, kwargs, state = _case(name)
    seg = jnp.asarray(SEGMENTS)
    wrt = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]
    out_shape, final_shape = jax.eval_shape(
        lambda: op(*args, initial_state=state, return_final_state=True, **kwargs))
    weights = normals(3, out_shape.shape), jax.tree.map(
        lambda s: normals(4, s.shape), final_shape)

    def loss(implementation, diff, state):
        full = list(args)
        for i, value in zip(wrt, diff, strict=True):
            full[i] = value
        out, final = op(*full, initial_state=state, segment_ids=seg, return_final_state=True,
                        implementation=implementation, **kwargs)
        total = jnp.sum(out * weights[0]) + sum(
            jnp.sum(f * w) for f, w in zip(jax.tree.leaves(final), jax.tree.leaves(weights[1]),
                                           strict=True))
        return total, (out, final)

    results = {impl: jax.jit(jax.value_and_grad(
        lambda d, s, impl=impl: loss(impl, d, s), argnums=(0, 1), has_aux=True))(
        [args[i] for i in wrt], state) for impl in ("reference", "xla")}
    (_, ref_values), ref_grads = results["reference"]
    (_, values), grads = results["xla"]
    assert_close(values, ref_values, 1e-10, f"{name} outputs and final state")
    assert_close(grads, ref_grads, 1e-9, f"{name} gradients")
    # The initial state reaches the outputs (its gradient is not the ~0 of a reset).
    assert all(float(jnp.linalg.norm(g)) > 1e-3 for g in jax.tree.leaves(ref_grads[1])), name
