"""`TokenContext` on its own: default positions from `start`, the leading-shape check of every
per-token array (naming it, what was expected and what was found), the segment extents made
once, the decode flags kept, a batch dict's fields and `extra.` entries taken (and nothing
else), and a missing extra named with those the context has."""

import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import presets
from hybrid_jax.config import ModelConfig
from hybrid_jax.context import TokenContext, document_index
from hybrid_jax.nn import create_model
from hybrid_jax.ops.attention import segment_extents


def test_positions_default_to_start_plus_time():
    ctx = TokenContext.create((2, 4), start=3)
    assert ctx.positions.dtype == jnp.int32
    np.testing.assert_array_equal(ctx.positions, [[3, 4, 5, 6]] * 2)
    assert ctx.segment_ids is None and ctx.segment_extents is None and ctx.extras == {}
    assert not ctx.record_steps and not ctx.fresh_cache
    flagged = TokenContext.create((2, 4), record_steps=True, fresh_cache=True)
    assert flagged.record_steps and flagged.fresh_cache


@pytest.mark.parametrize("start", [jnp.asarray([1, 2]), 1.5, jnp.float32(1)],
                         ids=["per-row", "float", "float-array"])
def test_start_is_one_integer(start):
    """A `[B]` start broadcast along time ([[1, 3], [1, 3]] for B = T = 2, no error) and a
    float one gave float positions: both are refused, naming what was found."""
    with pytest.raises(ValueError, match=r"TokenContext.start: expected one integer \(the "
                                         r"position of the first token\), got"):
        TokenContext.create((2, 2), start=start)


@pytest.mark.parametrize("field, value, message", [
    ("positions", jnp.zeros((2, 5), jnp.int32), r"TokenContext.positions: expected leading "
     r"shape \[batch, time\] = \[2, 4\] \(the tokens'\), got \[2, 5\]"),
    ("positions", jnp.zeros((4,), jnp.int32), r"TokenContext.positions: .* got \[4\]"),
    ("segment_ids", jnp.zeros((2, 3), jnp.int32), r"TokenContext.segment_ids: .* = \[2, 4\] "
     r"\(the tokens'\), got \[2, 3\]"),
    ("extras", {"mode": jnp.zeros((1, 4, 3))}, r"TokenContext.extras\['mode'\]: .* got "
     r"\[1, 4, 3\]"),
    # One integer a token: a trailing axis or a float id was taken (and cut into documents).
    ("segment_ids", jnp.zeros((2, 4, 3), jnp.int32), r"TokenContext.segment_ids: expected an "
     r"integer array \[batch, time\] = \[2, 4\], got shape \[2, 4, 3\] dtype int32"),
    ("segment_ids", jnp.zeros((2, 4), jnp.float32), r"segment_ids: .* dtype float32"),
    ("positions", jnp.zeros((2, 4, 1), jnp.int32), r"positions: .* shape \[2, 4, 1\]"),
    ("positions", jnp.zeros((2, 4), jnp.float32), r"positions: .* dtype float32"),
], ids=["positions-time", "positions-1d", "segment_ids", "extras", "segment_ids-3d",
        "segment_ids-float", "positions-3d", "positions-float"])
def test_every_per_token_array_is_checked(field, value, message):
    with pytest.raises(ValueError, match=message):
        TokenContext.create((2, 4), **{field: value})


def test_segment_extents_are_made_once_from_the_ids():
    ids = jnp.asarray([[1, 1, 2, 2, 2], [0, 3, 3, 3, 4]], jnp.int32)
    ctx = TokenContext.create((2, 5), segment_ids=ids)
    expected = segment_extents(ids)
    assert len(ctx.segment_extents) == len(expected) == 4
    for got, want in zip(ctx.segment_extents, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_from_batch_takes_positions_segment_ids_and_extra_entries_only():
    tokens = jnp.zeros((1, 4), jnp.int32)
    positions = jnp.asarray([[0, 1, 0, 1]], jnp.int32)
    ids = jnp.asarray([[1, 1, 2, 2]], jnp.int32)
    mode = jnp.asarray([[0.0, 1.0, 2.0, 0.0]])
    ctx = TokenContext.from_batch({"inputs": tokens, "targets": tokens, "mask": tokens,
                                   "positions": positions, "segment_ids": ids,
                                   "extra.mode": mode})
    np.testing.assert_array_equal(ctx.positions, positions)
    np.testing.assert_array_equal(ctx.segment_ids, [[0, 0, 1, 1]])  # document numbers
    assert ctx.segment_extents is not None
    assert list(ctx.extras) == ["mode"]
    np.testing.assert_array_equal(ctx.extra("mode"), mode)
    plain = TokenContext.from_batch({"inputs": tokens})
    np.testing.assert_array_equal(plain.positions, [[0, 1, 2, 3]])
    assert plain.segment_ids is None and plain.extras == {}


def test_documents_start_where_the_id_changes():
    ids = jnp.asarray([[7, 7, 3, 3, 7, 0], [5, 5, 5, 5, 5, 5]], jnp.int32)
    np.testing.assert_array_equal(document_index(ids), [[0, 0, 1, 1, 2, 3], [0] * 6])


def test_positions_default_to_each_tokens_place_in_its_document():
    ctx = TokenContext.create((2, 7), segment_ids=jnp.asarray([[1, 1, 2, 2, 2, 1, 1], [4] * 7]))
    np.testing.assert_array_equal(ctx.positions, [[0, 1, 0, 1, 2, 0, 1], list(range(7))])
    np.testing.assert_array_equal(  # decoding's offset applies to the first document
        TokenContext.create((1, 4), segment_ids=jnp.asarray([[1, 1, 2, 2]]), start=5).positions,
        [[5, 6, 0, 1]])
    np.testing.assert_array_equal(TokenContext.create((1, 3), start=2).positions, [[2, 3, 4]])


def test_packed_documents_without_positions_match_each_alone_with_a_learned_table():
    """Learned absolute positions are where a row-wide default would be wrong."""
    model = create_model(ModelConfig(layers=("attention",), vocab_size=32, d_model=16,
                                     num_heads=2, position_embedding="learned",
                                     max_positions=16))
    tokens = jnp.arange(3, 12, dtype=jnp.int32)[None]
    packed = model(tokens, segment_ids_BT=jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 2]]))
    np.testing.assert_allclose(packed[:, :4], model(tokens[:, :4]), atol=1e-6)
    np.testing.assert_allclose(packed[:, 4:], model(tokens[:, 4:]), atol=1e-6)


@pytest.mark.parametrize("preset", ["transformer-tiny", "oryx-gdn-tiny"])
def test_an_id_that_comes_back_is_a_new_document_for_attention_too(preset):
    """[1 1 1 2 2 2 1 1 1]: the third run is a document of its own, for attention as for the
    recurrences (the attention op alone would let it see the first)."""
    model = create_model(presets.get(preset))
    tokens = jnp.arange(3, 12, dtype=jnp.int32)[None]
    positions = jnp.asarray([[0, 1, 2] * 3], jnp.int32)
    back = model(tokens, segment_ids_BT=jnp.asarray([[1, 1, 1, 2, 2, 2, 1, 1, 1]]),
                 positions_BT=positions)
    new = model(tokens, segment_ids_BT=jnp.asarray([[1, 1, 1, 2, 2, 2, 3, 3, 3]]),
                positions_BT=positions)
    alone = model(tokens[:, 6:], positions_BT=positions[:, 6:])
    np.testing.assert_array_equal(back, new)
    np.testing.assert_allclose(back[:, 6:], alone, atol=1e-5)


def test_a_missing_extra_names_the_batch_key_and_the_extras_there_are():
    ctx = TokenContext.create((1, 2), extras={"other": jnp.zeros((1, 2))})
    with pytest.raises(ValueError, match=r"needs the per-token array 'mode' in the context "
                                         r"\(batch key 'extra.mode', .*the context has "
                                         r"\['other'\]"):
        ctx.extra("mode")
