"""Flash-attention Pallas kernels (interpret mode, float32) against the XLA reference with
segment ids: values and gradients of q, k, v; the block bounds against the mask they summarise.

Tiny tiles (8/16) so that short sequences span several query and key blocks, with document
boundaries on and off block edges, documents of length 1, odd lengths and documents longer
than the window.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.flash_attention import api
from pallas_kernels.flash_attention.block_sizes import BlockSizes
from pallas_kernels.flash_attention.bounds import document_extents, pad_extents, visible_span
from pallas_kernels.flash_attention.gpu import MASK_VALUE, Static
from pallas_kernels.flash_attention.reference import visible
from tests.helpers import assert_close, normals

TINY = BlockSizes(block_q=16, block_k=8, block_q_dq=8, block_k_dq=16, block_q_dkv=8,
                  block_k_dkv=16)


def segments_from_lengths(*rows):
    """`[B, T]` ids from per-row document lengths (ids 0, 1, ...)."""
    return jnp.asarray([np.repeat(np.arange(len(r)), r) for r in rows], jnp.int32)


# Row 0: boundaries at 8 and 16 (on key/query block edges), a 1-token document, odd lengths;
# row 1: boundaries off the edges and a document (23) longer than every window tested.
PACKED = segments_from_lengths([8, 8, 1, 13, 3, 1, 5], [5, 1, 23, 2, 8])


def run(q, k, v, segment_ids, window, implementation, head_dim_blocks=TINY, active=None):
    return api.flash_attention(q, k, v, segment_ids, window=window, block_sizes=head_dim_blocks,
                               active_queries=active, implementation=implementation,
                               interpret=True)


def check(q, k, v, segment_ids, window, blocks=TINY, tol=1e-5, active=None, reference_q=None):
    """The kernels against the reference, values and gradients (a loss that weights every
    row, inactive ones too); `reference_q` the queries given to the reference instead."""
    def loss(impl):
        def f(q, k, v):
            out = run(q, k, v, segment_ids, window, impl, blocks, active)
            return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape))), out
        return jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)

    (_, out), grads = loss("gpu")(q, k, v)
    (_, ref), ref_grads = loss("reference")(q if reference_q is None else reference_q, k, v)
    what = f"window={window} segments={segment_ids is not None} D={q.shape[-1]}"
    assert_close(out, ref, tol, what + " values")
    assert_close(grads, ref_grads, tol, what + " gradients")


@pytest.mark.parametrize("window", [None, 1, 6])
def test_packed_gqa_matches_reference(window):
    q, k, v = normals(0, (2, 39, 4, 8), (2, 39, 2, 8), (2, 39, 2, 8), dtype=np.float32)
    check(q, k, v, PACKED, window)


def test_unpacked_and_non_contiguous_ids():
    q, k, v = normals(1, (2, 39, 2, 8), (2, 39, 1, 8), (2, 39, 1, 8), dtype=np.float32)
    check(q, k, v, None, None)
    # The same id in two runs: the second run still sees the first (the mask's definition).
    ids = jnp.asarray([[0] * 10 + [1] * 9 + [0] * 20, [2] * 39], jnp.int32)
    check(q, k, v, ids, 15)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_head_dims(head_dim):
    q, k, v = normals(2, (1, 39, 2, head_dim), (1, 39, 1, head_dim), (1, 39, 1, head_dim),
                      dtype=np.float32)
    check(q, k, v, PACKED[1:], 6)


@pytest.mark.parametrize("variant", [dict(dq_atomic=True), dict(dkv_per_query_head=True),
                                     dict(dq_atomic=True, dkv_per_query_head=True)])
def test_backward_variants(variant):
    """dq by atomics from the dk/dv kernel; dk/dv per query head summed over the GQA group."""
    q, k, v = normals(4, (1, 39, 4, 8), (1, 39, 2, 8), (1, 39, 2, 8), dtype=np.float32)
    check(q, k, v, PACKED[1:], 6, dataclasses.replace(TINY, **variant))


# Query rows per row: blocks of 16 all inactive (rows 16-31 of row 0, 0-15 of row 1), partly
# active blocks, and the padded tail (39 → 48) inactive.
ACTIVE = jnp.asarray([np.r_[np.ones(16), np.zeros(16), np.ones(3), np.zeros(4)],
                      np.r_[np.zeros(16), np.tile([1, 0, 0], 7), np.ones(2)]], bool)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("variant", [{}, dict(dq_atomic=True, dkv_per_query_head=True),
                                     dict(forward_one_select=True, diagonal_causal_only=True)])
def test_active_queries(variant, window):
    """Inactive query rows are 0 and pass no gradient (their dO is ignored); blocks of them
    are skipped: NaN queries there reach no output or gradient (a visited block would spread
    them), and the reference gets finite ones (inactive rows' queries do not matter)."""
    q, k, v = normals(8, (2, 39, 4, 8), (2, 39, 2, 8), (2, 39, 2, 8), dtype=np.float32)
    skipped = jnp.zeros((2, 39), bool).at[0, 16:32].set(True).at[1, :16].set(True)
    q_nan = jnp.where(skipped[..., None, None], jnp.nan, q)
    check(q_nan, k, v, PACKED, window, dataclasses.replace(TINY, **variant), active=ACTIVE,
          reference_q=q)


def test_active_queries_are_checked():
    q, k, v = normals(8, (2, 39, 4, 8), (2, 39, 2, 8), (2, 39, 2, 8), dtype=np.float32)
    for bad in (ACTIVE.astype(jnp.int32), ACTIVE[:, :38]):
        with pytest.raises(ValueError, match=r"active_queries must be bool \[B, T\] = \[2, 39\]"):
            run(q, k, v, PACKED, None, "gpu", active=bad)


OPTIONS = [dict(forward_one_select=True), dict(diagonal_causal_only=True),
           dict(forward_one_select=True, diagonal_causal_only=True, dkv_per_query_head=True)]


@pytest.mark.parametrize("window", [None, 1, 6])
@pytest.mark.parametrize("option", OPTIONS)
def test_masking_options(option, window):
    """One select in the forward (a row's all-masked first block is undone by its first
    visible key) and the causal test alone on the diagonal (no document edge inside it):
    documents of length 1, odd, longer than a block, boundaries on and off block edges, GQA."""
    q, k, v = normals(6, (2, 39, 4, 8), (2, 39, 2, 8), (2, 39, 2, 8), dtype=np.float32)
    check(q, k, v, PACKED, window, dataclasses.replace(TINY, **option))


@pytest.mark.parametrize("option", OPTIONS[:2])
def test_masking_options_wide_tiles_and_repeated_ids(option):
    """Query tiles of 32 over key tiles of 8 (several diagonal blocks a query block, as at
    block_q 128, block_k 32) and ids that come back (the runs, not the extents, bound the
    causal-only part)."""
    q, k, v = normals(7, (2, 64, 2, 8), (2, 64, 1, 8), (2, 64, 1, 8), dtype=np.float32)
    ids = jnp.asarray([[0] * 10 + [1] * 9 + [0] * 20 + [3] * 25,
                       np.repeat(np.arange(6), [1, 16, 3, 31, 8, 5])], jnp.int32)
    blocks = BlockSizes(block_q=32, block_k=8, block_q_dq=32, block_k_dq=8, block_q_dkv=8,
                        block_k_dkv=32, **option)
    check(q, k, v, ids, None, blocks)
    check(q, k, v, ids, 12, blocks)


def test_given_extents_and_padding():
    """Extents computed once by the caller give the kernel's own result; padding them equals
    the extents of the padded ids (the pad joins the last document and run)."""
    q, k, v = normals(5, (1, 39, 2, 8), (1, 39, 1, 8), (1, 39, 1, 8), dtype=np.float32)
    ids = PACKED[1:]
    np.testing.assert_array_equal(
        api.flash_attention(q, k, v, ids, extents=document_extents(ids), window=6,
                            block_sizes=TINY, interpret=True),
        run(q, k, v, ids, 6, "gpu"))
    for ids in (PACKED, PACKED.at[0, 30:39].set(0)):
        padded = jnp.pad(ids, [(0, 0), (0, 9)], mode="edge")
        for got, want in zip(pad_extents(document_extents(ids), 48), document_extents(padded),
                             strict=True):
            np.testing.assert_array_equal(got, want)
    none = document_extents(None, (2, 39))
    for got, want in zip(none, document_extents(jnp.zeros((2, 39), jnp.int32)), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("window", [None, 6])
def test_bounds_match_the_mask(window):
    """lowest/highest are the first/last visible ones (conservative when an id comes back);
    the unmasked spans are fully visible."""
    length = PACKED.shape[1]
    t = jnp.arange(length)
    for ids, exact in ((PACKED, True), (PACKED.at[0, 30:33].set(0), False)):
        lowest, highest, unmasked_from, unmasked_until = visible_span(document_extents(ids), window)
        mask = visible(t[:, None], t[None, :], ids[:, :, None], ids[:, None, :], window)
        first_visible = jnp.argmax(mask, axis=2)
        last_visible = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)
        if exact:
            np.testing.assert_array_equal(lowest, first_visible)
            np.testing.assert_array_equal(highest, last_visible)
        assert bool(jnp.all(lowest <= first_visible)) and bool(jnp.all(highest >= last_visible))
        keys_inside = (t[None, None, :] >= unmasked_from[:, :, None]) & (t <= t[:, None])
        queries_inside = (t[None, :, None] <= unmasked_until[:, None, :]) & (t[:, None] >= t)
        assert bool(jnp.all(mask | ~keys_inside)) and bool(jnp.all(mask | ~queries_inside))
        assert int(keys_inside.sum()) > length  # not trivially empty


def test_block_sizes_are_checked_and_list_their_changes():
    """Tiles are powers of two of at least 8, launch counts at least 1 (`TileChecks`)."""
    for bad, message in ((dict(block_q=4), "block_q must be a power of two >= 8, got 4"),
                         (dict(block_k_dkv=48), "block_k_dkv must be a power of two >= 8, got 48"),
                         (dict(dq_num_stages=0), "dq_num_stages must be >= 1, got 0")):
        with pytest.raises(ValueError, match=message):
            BlockSizes(**bad)
    assert BlockSizes(block_k=32, dq_atomic=True).changed() == {"block_k": 32, "dq_atomic": True}


def test_rejects_bad_inputs():
    q = jnp.zeros((1, 16, 2, 8))
    with pytest.raises(ValueError, match="segment_ids must be integer"):
        api.flash_attention(q, q, q, jnp.zeros((1, 15), jnp.int32), interpret=True)
    with pytest.raises(ValueError, match="window must be >= 1"):
        api.flash_attention(q, q, q, window=0, interpret=True)
    q64 = jnp.zeros((1, 16, 2, 64))
    assert "bfloat16" in api.unsupported(q64, q64, q64)  # float32 is for interpret mode only
    assert "head_dim must be one of" in api.unsupported(*(x.astype(jnp.bfloat16) for x in (q,) * 3))
    with pytest.raises(ValueError, match="extents need the segment_ids"):
        api.flash_attention(q, q, q, extents=document_extents(None, (1, 16)), interpret=True)
    with pytest.raises(ValueError, match="extents must be bounds.Extents"):
        api.flash_attention(q, q, q, jnp.zeros((1, 16), jnp.int32),
                            extents=document_extents(None, (1, 15)), interpret=True)
    with pytest.raises(ValueError, match="implementation must be one of"):
        api.flash_attention(q, q, q, implementation="cudnn", interpret=True)


@pytest.mark.parametrize("head_dim", [8, 16, 64, 128, 256])
def test_masked_logits_cancel_exactly_under_an_fma(head_dim):
    """With `forward_one_select`, a row that has seen no visible key yet takes
    p = exp2(MASK·scale2 − m) on its masked keys, m = fl(MASK·scale2): 1 only if the difference
    is exactly 0 also when computed as one FMA (the exact product minus its rounding). The
    mask value is a power of two, so the product is exact; −1e30 left ±1e22 (p = inf, then
    NaN at the row's first visible key: a random configuration of session 24)."""
    st = Static(window=None, scale=head_dim**-0.5, group=1, blocks=TINY, interpret=True)
    scale2 = np.float32(st.scale2)
    assert np.float32(MASK_VALUE) * scale2 == np.float64(MASK_VALUE) * np.float64(scale2)
    assert np.isfinite(np.float32(MASK_VALUE) * scale2)


def test_one_select_with_a_first_block_masked_for_its_rows():
    """The configuration that found it: rows whose first visited key block lies before their
    document, forward_one_select with the causal-only diagonal and dq by atomics, GQA, T 43
    padded to 64 (values and gradients)."""
    ids = segments_from_lengths([9, 13, 1, 17, 3])
    q, k, v = normals(8, (1, 43, 4, 16), (1, 43, 2, 16), (1, 43, 2, 16), dtype=np.float32)
    blocks = BlockSizes(block_q=16, block_k=16, block_q_dq=32, block_k_dq=8, block_q_dkv=16,
                        block_k_dkv=16, dq_atomic=True, forward_one_select=True,
                        diagonal_causal_only=True)
    check(q, k, v, ids, None, blocks)


def test_empty_inputs_are_refused():
    """T = 0 or no kv heads: a reason, not a crash inside the kernels (they took T = 0 and
    failed in a slice; auto dispatch falls back to the XLA rung, which takes it)."""
    q, k = jnp.zeros((1, 0, 2, 8)), jnp.zeros((1, 5, 0, 8))
    assert "must not be empty" in api.unsupported(q, q, q, interpret=True)
    assert "must not be empty" in api.unsupported(jnp.zeros((1, 5, 2, 8)), k, k, interpret=True)


def test_a_fractional_window_is_refused():
    """window=2.5 was accepted and failed in the kernels' integer arithmetic (a TypeError)."""
    q = jnp.zeros((1, 5, 2, 8))
    assert "window must be >= 1 (an int)" in api.unsupported(q, q, q, window=2.5, interpret=True)
    assert api.unsupported(q, q, q, window=np.int64(3), interpret=True) is None
