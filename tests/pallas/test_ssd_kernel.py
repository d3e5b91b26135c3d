"""SSD Pallas kernels (interpret mode on CPU) against the op's per-token reference in float64.

The kernels compute in float32; values and the gradients of every input (x, dt, A, B, C and the
initial state, through y and the final state) must agree to ~1e-5. Tiny tiles (chunk 8, state
and feature tiles of 4 of P = 8) so a short sequence spans several chunks and every feature
loop runs twice. A lowering test builds the Triton kernels at the GPU's shapes without a GPU.
The TPU kernels (`backend="tpu"`) run in TPU interpret mode against the same reference
(test_tpu_lowering.py lowers them for a TPU at real shapes).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from hybrid_jax.ops.ssd import ssd as ssd_op
from pallas_kernels.ssd import api, segments
from pallas_kernels.ssd.block_sizes import BlockSizes, default_block_sizes
from pallas_kernels.ssd.segments import choose_segments
from tests.helpers import assert_close, normals

TINY = BlockSizes(chunk=8, block_p=4, backward_block_p=4, grads_block_p=4)
SPLIT = dataclasses.replace(TINY, split_forward=True)
# fla's form: a state-only serial pass (state columns in blocks of 8 of N = 16), the outputs
# in parallel from the stored states, the cumulative log decay made before the kernels
STATE_PASS = dataclasses.replace(TINY, state_pass=True, state_block_n=8, cumulative_decay=True)
# the same, each step of the state pass reading its own chunk's vectors (NOTES.md round 7)
IN_STEP = dataclasses.replace(STATE_PASS, state_vectors_in_step=True)
# the per-chunk gradients summing the heads' score gradients before their products with B and C
# (NOTES.md session 18)
SUMMED = dataclasses.replace(TINY, grads_summed_scores=True)
# the reverse pass's state in column tiles too (8 of N = 16; with TINY's rows of 4 of P = 8, four
# programs a head), as mamba2-340m's `[64, 64]` tiles (NOTES.md session 19)
BACKWARD_COLUMNS = dataclasses.replace(STATE_PASS, backward_block_n=8)
TPU_WHOLE_P = BlockSizes(chunk=8, block_p=8, backward_block_p=8)  # one state tile, as by default
NAMES = ("x", "dt", "A", "B", "C", "initial_state")


def make_inputs(seed, batch, length, heads, groups, head_dim=8, state_dim=16):
    x, dt_raw, a_raw, B, C, s0 = normals(
        seed, (batch, length, heads, head_dim), (batch, length, heads), (heads,),
        (batch, length, groups, state_dim), (batch, length, groups, state_dim),
        (batch, heads, head_dim, state_dim), dtype=np.float32)
    dt = 0.5 * jax.nn.softplus(dt_raw)
    A = -jnp.exp(0.5 * a_raw)  # some chunks decay by e^{-10} and more
    return dict(x=x, dt=dt, A=A, B=B, C=C, initial_state=s0)


def documents(length: int) -> np.ndarray:
    """Row 0: starts on chunk edges (8, 16) and off them, a length-1 document (11); row 1:
    length-1 documents only, then one long document."""
    ids = np.zeros((2, length), np.int32)
    for start in (3, 8, 11, 12, 16):
        ids[0, start:] += 1
    ids[1] = np.minimum(np.arange(length), 10)
    return ids


def kernel_fn(segment_ids, with_initial=True, blocks=TINY, backend=None):
    def fn(x, dt, A, B, C, initial_state, D=None):
        return api.ssd(x, dt, A, B, C, segment_ids=segment_ids,
                       initial_state=initial_state if with_initial else None, D=D,
                       block_sizes=blocks, backend=backend, interpret=True)
    return fn


def reference_fn(segment_ids, with_initial=True):
    def fn(x, dt, A, B, C, initial_state, D=None):
        return ssd_op(x, dt, A, B, C, segment_ids=segment_ids, return_final_state=True,
                      initial_state=initial_state if with_initial else None, D=D,
                      implementation="reference")
    return fn


def values_and_grads(fn, inputs, seed):
    """(y, final state) and the gradients of Σ w·y + Σ w_f·final w.r.t. every input (`NAMES`,
    then the skip `D` where `inputs` has one)."""
    @jax.jit
    def run(inputs):
        out, vjp = jax.vjp(fn, *(inputs[n] for n in _names(inputs)))
        weights = normals(seed, out[0].shape, out[1].shape, dtype=np.float32)
        return out, vjp(tuple(w.astype(o.dtype) for w, o in zip(weights, out, strict=True)))

    return run(inputs)


def _names(inputs):
    return NAMES + (("D",) if "D" in inputs else ())


def check_against_reference(inputs, segment_ids, with_initial=True, blocks=TINY, backend=None):
    out, grads = values_and_grads(kernel_fn(segment_ids, with_initial, blocks, backend), inputs,
                                  seed=7)
    assert out[0].dtype == jnp.float32 and out[1].dtype == jnp.float32
    with jax.enable_x64(True):
        wide = {n: jnp.asarray(np.asarray(v), jnp.float64) for n, v in inputs.items()}
        ids = None if segment_ids is None else jnp.asarray(segment_ids)
        ref_out, ref_grads = values_and_grads(reference_fn(ids, with_initial), wide, seed=7)
        assert_close(out, ref_out, 1e-5, "y, final state")
        for name, grad, ref in zip(_names(inputs), grads, ref_grads, strict=True):
            if with_initial or name != "initial_state":
                assert_close(grad, ref, 1e-5, f"d{name}")


@pytest.mark.parametrize("blocks", [
    TINY, SPLIT, STATE_PASS, dataclasses.replace(TINY, state_pass=True),
    IN_STEP, dataclasses.replace(TINY, state_pass=True, state_vectors_in_step=True),
    dataclasses.replace(TINY, cumulative_decay=True), dataclasses.replace(TINY, decays_first=True),
    SUMMED, BACKWARD_COLUMNS, dataclasses.replace(TINY, backward_block_n=8)],
    ids=["fused", "split_forward", "state_pass", "state_pass_whole_n",
         "state_pass_vectors_in_step", "state_pass_whole_n_vectors_in_step", "cumulative_decay",
         "decays_first", "grads_summed_scores", "backward_block_n",
         "fused_backward_block_n"])
def test_documents_initial_state_groups_odd_length(blocks):
    """19 steps in chunks of 8 (padded to 24), G = 2 groups of 2 heads, packed documents; the
    forward fused or split (within-chunk outputs from their own kernel), or as a state-only
    pass and a parallel output kernel, the state in column blocks or whole; the cumulative
    log decay scanned in the kernels or made before them (the state pass reading each chunk's
    vectors a step ahead or in the step itself); the fused step's pair decays formed before or
    after its first tile read; the per-chunk gradients summing the heads' score gradients; the
    reverse pass's state in row and column tiles."""
    inputs = make_inputs(0, batch=2, length=19, heads=4, groups=2)
    check_against_reference(inputs, documents(19), blocks=blocks)


@pytest.mark.parametrize("head_dim, groups, packed, with_initial, blocks", [
    (64, 1, True, True, dataclasses.replace(STATE_PASS, block_p=64, backward_block_p=64,
                                            grads_block_p=64, grads_summed_scores=True)),
    (16, 2, True, True, dataclasses.replace(SUMMED, grads_block_p=8)),
    (16, 1, False, False, SUMMED)],
    ids=["P64_one_group", "P16_two_tiles_two_groups", "P16_no_documents_no_initial"])
def test_grads_summed_scores_head_dims(head_dim, groups, packed, with_initial, blocks):
    """`grads_summed_scores` (C·Bᵀ and the chunk sums of the log decays by XLA): at Mamba-2's
    head dim 64 in one tile behind the state pass, with one group for 4 heads (as mamba2-340m),
    and at P 16 in tiles of 8 with 2 groups or of 4 with one; with and without documents and
    an initial state; 21 steps in chunks of 8 (padded)."""
    inputs = make_inputs(10, batch=2, length=21, heads=4, groups=groups, head_dim=head_dim)
    check_against_reference(inputs, documents(21) if packed else None, with_initial, blocks)


@pytest.mark.parametrize("head_dim, state_dim, groups, packed, with_initial, blocks", [
    (64, 16, 1, True, True, dataclasses.replace(
        STATE_PASS, block_p=64, backward_block_p=64, grads_block_p=64, grads_summed_scores=True,
        backward_block_n=4)),
    (8, 32, 2, False, False, dataclasses.replace(SUMMED, backward_block_n=16)),
    (8, 16, 1, True, True, dataclasses.replace(TINY, backward_block_n=16))],
    ids=["P64_four_columns_mamba2_defaults", "N32_two_columns_no_documents_no_initial",
         "whole_n_as_none"])
def test_backward_block_n_head_and_state_dims(head_dim, state_dim, groups, packed, with_initial,
                                              blocks):
    """`backward_block_n` (the reverse pass's state in column tiles, `kept` summed over them):
    at Mamba-2's head dim 64 in one row tile, one group for 4 heads, the bf16 default's other
    options (state pass, summed scores), N 16 in 4 column tiles; N 32 in 2 with 2 groups, no
    documents, no initial state; a tile of all N (the default's kernel); 21 steps in chunks of
    8 (padded)."""
    inputs = make_inputs(11, batch=2, length=21, heads=4, groups=groups, head_dim=head_dim,
                         state_dim=state_dim)
    check_against_reference(inputs, documents(21) if packed else None, with_initial, blocks)


def test_backward_block_n_is_checked():
    with pytest.raises(ValueError, match="backward_block_n must be None or a power of two, got 48"):
        BlockSizes(backward_block_n=48)


def test_one_document_zero_initial_state_one_head_per_group():
    """No segment ids (the kernels' mask-free path), no initial state, G = H, 21 steps."""
    inputs = make_inputs(1, batch=1, length=21, heads=2, groups=2)
    check_against_reference(inputs, None, with_initial=False)


@pytest.mark.parametrize("blocks", [TINY, STATE_PASS, IN_STEP],
                         ids=["fused", "state_pass", "state_pass_vectors_in_step"])
def test_forward_only_and_bfloat16_inputs(blocks):
    """The primal forward (no stored states) in bf16: y bf16, final state float32, near the
    float32 kernel; and the state pass's primal forward against the reference."""
    inputs = make_inputs(2, batch=1, length=13, heads=2, groups=1)
    ids = np.array([[0] * 5 + [1] * 8], np.int32)
    narrow = {n: v.astype(jnp.bfloat16) for n, v in inputs.items()}
    wide = {n: v.astype(jnp.float32) for n, v in narrow.items()}
    run = jax.jit(lambda x: kernel_fn(ids, blocks=blocks)(*(x[n] for n in NAMES)))
    if blocks.state_pass:
        reference = jax.jit(lambda x: kernel_fn(ids)(*(x[n] for n in NAMES)))
        assert_close(run(inputs), reference(inputs), 1e-5, "state pass primal")
    y, final = run(narrow)
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    assert_close((y.astype(jnp.float32), final), run(wide), 2e-2, "bf16 vs float32")


def segment_documents(length: int) -> np.ndarray:
    """Starts against the segments of 8 tokens (S = 4 of 29 steps padded to 32) and of 16
    (S = 2). Row 0: on boundaries (8, 16: a length-1 document first in its segment), one after
    (17) and inside (21, a document over the boundary at 24); row 1: one after (9, 25) and
    inside (3, 12: a document over the boundaries at 16 and 24, through a whole segment)."""
    ids = np.zeros((2, length), np.int32)
    for row, starts in enumerate([(8, 16, 17, 21), (3, 9, 12, 25)]):
        for start in starts:
            ids[row, start:] += 1
    return ids


@pytest.mark.parametrize("segments, packed, with_initial, heads, groups, length", [
    (2, True, True, 4, 2, 29), (4, True, False, 2, 1, 29), (4, False, True, 2, 2, 27)])
def test_sequence_segments_match_reference(segments, packed, with_initial, heads, groups,
                                           length):
    """Rows split into S segments (the kernels on [B·S, T/S], combined in XLA): values and
    every gradient as unsplit, with documents on, next to and inside segment boundaries, with
    and without initial state, odd lengths (padding), G < H and G = H."""
    inputs = make_inputs(4 + segments, batch=2, length=length, heads=heads, groups=groups)
    check_against_reference(inputs, segment_documents(length) if packed else None,
                            with_initial, dataclasses.replace(TINY, segments=segments))


def test_state_pass_on_sequence_segments():
    """The state-only pass and the parallel outputs on rows split into 2 segments, documents
    on and inside segment boundaries, an initial state."""
    inputs = make_inputs(9, batch=2, length=29, heads=4, groups=2)
    check_against_reference(inputs, segment_documents(29), True,
                            dataclasses.replace(STATE_PASS, segments=2))


@pytest.mark.parametrize("blocks, backend", [
    (TINY, None), (SPLIT, None), (dataclasses.replace(STATE_PASS, grads_summed_scores=True), None),
    (dataclasses.replace(STATE_PASS, segments=2), None), (TINY, "tpu")],
    ids=["fused", "split_forward", "state_pass_summed", "state_pass_segments", "tpu"])
def test_skip_d(blocks, backend):
    """Mamba-2's skip D (`y_t + D_h·x_t`), added by the kernel that writes y (the fused or
    split forward's loop, the state pass's output kernel; after the TPU kernels): values and
    every gradient, dD included, against the per-token reference with D; documents, an initial
    state, G = 2 groups of 2 heads, 19 steps (padded); rows in 2 segments."""
    inputs = make_inputs(11, batch=2, length=19, heads=4, groups=2)
    inputs["D"] = normals(12, (4,), dtype=np.float32)
    check_against_reference(inputs, documents(19), blocks=blocks, backend=backend)


def test_sequence_segments_keep_no_float32_per_token_product(capsys):
    """The segments' readout of their entering states (float32 `[B, S−1, L, H, P]`) is
    recomputed in the backward, not kept: with S = 4 it was the op's largest residual (mamba2-340m
    at B1 T32768: 192 MiB a layer). Nothing the segment combine keeps is that large."""
    inputs = make_inputs(3, batch=1, length=32, heads=2, groups=1)
    fn = kernel_fn(None, True, dataclasses.replace(TINY, segments=4))
    capsys.readouterr()
    print_saved_residuals(lambda *a: jnp.sum(fn(*a)[0]), *(inputs[n] for n in NAMES))
    kept = re.findall(r"\bf32\[([\d,]*)\] (.*)", capsys.readouterr().out)
    # [B, S−1, L, H, P] (or with H as G × H/G): 1 row, 3 later segments of 8, 2 heads, P 8.
    readout_shapes = {"1,3,8,2,8", "1,3,8,1,2,8"}
    from_combine = [(dims, why) for dims, why in kept if dims in readout_shapes]
    assert any("segments.py" in why for _, why in kept)  # the parse sees the combine's residuals
    assert not from_combine, from_combine


def test_entering_readout_is_rounded_to_the_operands_dtype():
    """Session 36: the segments' readout `S_in C_t` comes out of its product in the operands'
    dtype (bf16 on the GPU: half the bytes of the combine's largest array), from float32 sums,
    and its weight and add stay float32."""
    bf16 = lambda seed, shape: jnp.asarray(normals(seed, shape, dtype=np.float32), jnp.bfloat16)
    C = bf16(1, (1, 2, 5, 1, 8))  # [B, S−1, L, G, N]
    state = bf16(2, (1, 2, 1, 2, 4, 8))  # [B, S−1, G, H/G, P, N]
    weight = jnp.asarray(np.abs(normals(3, (1, 2, 5, 2), dtype=np.float32)))
    exact = jnp.einsum("bslgn,bsgrpn->bslgrp", C.astype(jnp.float32), state.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
    readout = segments._readout(C, state)
    assert readout.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(readout, np.float32),
                                  np.asarray(exact.astype(jnp.bfloat16), np.float32))
    term = segments._entering_readout(C, state, weight)
    assert term.dtype == jnp.float32
    np.testing.assert_allclose(term, weight.reshape(1, 2, 5, 1, 2, 1) * readout.astype(
        jnp.float32), rtol=1e-6)


def test_choose_segments_rule():
    """The largest power of two with ≤ 1 program per SM and ≥ 8 chunks per segment."""
    assert choose_segments(programs=128, num_chunks=128, sms=132) == 1  # B4 T8192 H16
    assert choose_segments(programs=256, num_chunks=64, sms=132) == 1  # B8 T4096
    assert choose_segments(programs=64, num_chunks=256, sms=132) == 2  # B2 T16384
    assert choose_segments(programs=32, num_chunks=512, sms=132) == 4  # B1 T32768
    assert choose_segments(programs=1, num_chunks=1024, sms=132) == 128  # chunks bound
    assert choose_segments(programs=16, num_chunks=15, sms=132) == 1
    assert choose_segments(programs=16, num_chunks=16, sms=132) == 2
    assert choose_segments(programs=133, num_chunks=1024, sms=132) == 1
    with pytest.raises(ValueError, match="segments must be None or a power of two, got 3"):
        BlockSizes(segments=3)


STATE_PASS_GPU = dict(state_pass=True, state_block_n=64, cumulative_decay=True)
FUSED_GPU = dict(state_pass=False, state_block_n=None, cumulative_decay=False)


@pytest.mark.parametrize("head_dim, state_dim, groups, packed, changes, kernels",
                         [(128, 128, 1, True, {}, 4), (64, 256, 4, False, {}, 3),
                          (64, 128, 1, True, {}, 4),  # Mamba-2's heads: chunk_grads 3 stages
                          (64, 128, 1, True, dict(grads_summed_scores=True), 4),
                          (64, 128, 1, True, dict(backward_block_n=64), 4),  # state_grads [64, 64]
                          (128, 128, 1, True, FUSED_GPU, 3),
                          (128, 128, 1, True, dict(FUSED_GPU, split_forward=True), 4),
                          (128, 128, 1, True, STATE_PASS_GPU, 4),
                          (128, 128, 1, True, dict(STATE_PASS_GPU, state_vectors_in_step=True), 4),
                          (64, 256, 4, False, STATE_PASS_GPU, 4),
                          # Mamba-2's skip D in the kernel that writes y, in each forward form
                          (64, 128, 1, True, dict(skip=True), 4),
                          (128, 128, 1, True, dict(FUSED_GPU, skip=True), 3),
                          (128, 128, 1, True, dict(FUSED_GPU, split_forward=True, skip=True), 4)])
def test_kernels_lower_to_triton_at_gpu_shapes(monkeypatch, head_dim, state_dim, groups,
                                               packed, changes, kernels):
    """Forward and backward build Triton kernels (Pallas' Triton lowering, no GPU needed) at
    the default tiles, with and without documents, the forward fused or split (either form),
    with Mamba-2's skip D or without; the automatic sequence segments (the CPU device has no
    SM count: `segments.FALLBACK_SMS`) split these rows in 2 (P = N = 128) and 4 (P = 64,
    N = 256)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
    batch, length, heads = 2, 1000, 8
    args = (spec(batch, length, heads, head_dim), spec(batch, length, heads),
            spec(heads, dtype=jnp.float32), spec(batch, length, groups, state_dim),
            spec(batch, length, groups, state_dim), spec(batch, length, dtype=jnp.int32),
            spec(heads, dtype=jnp.float32))
    changes = dict(changes)
    skip = changes.pop("skip", False)

    def grads(x, dt, A, B, C, ids, D):
        blocks = dataclasses.replace(default_block_sizes(head_dim, state_dim), **changes)
        out, vjp = jax.vjp(lambda *a: api.ssd(*a[:5], segment_ids=ids if packed else None,
                                              D=a[5] if skip else None, block_sizes=blocks),
                           x, dt, A, B, C, D)
        return vjp(out)

    text = jax.jit(grads).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == kernels


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_default_tiles_run_the_state_pass(monkeypatch, dtype):
    """At P = N = 128 on the GPU the default is the state pass (NOTES.md rounds 5-6) for a
    forward alone (its two kernels) and for training (two more for the backward), at 4 / 3
    pipeline stages with the state kernel's vectors read in step (round 7) for 2-byte inputs
    and 2 / 2 for float32 ones; 3 stages for the per-chunk gradients at P 64 (session 16)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    spec = lambda *shape, dtype=dtype: jax.ShapeDtypeStruct(shape, dtype)
    args = (spec(2, 256, 4, 128), spec(2, 256, 4), spec(4, dtype=jnp.float32),
            spec(2, 256, 1, 128), spec(2, 256, 1, 128))
    kernels = lambda fn: jax.jit(fn).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text().count("__gpu$xla.gpu.triton")

    def grads(*a):
        out, vjp = jax.vjp(lambda *b: api.ssd(*b), *a)
        return vjp(out)

    assert kernels(lambda *a: api.ssd(*a)) == 2
    assert kernels(grads) == 4
    stages = default_block_sizes(128, 128, itemsize=jnp.dtype(dtype).itemsize)
    bf16 = dtype == jnp.bfloat16
    assert (stages.num_stages, stages.local_num_stages, stages.state_vectors_in_step) == (
        (4, 3, True) if bf16 else (2, 2, False))
    # the per-chunk gradients pipeline their head loop at P 64 (session 16) and, summing their
    # heads' score gradients (sessions 18 and 19), at 2 stages at P 128; bf16 only
    heads_of_64 = default_block_sizes(64, 128, itemsize=jnp.dtype(dtype).itemsize)
    assert (stages.grads_num_stages, heads_of_64.grads_num_stages) == ((2, 3) if bf16 else (1, 1))
    assert (stages.grads_summed_scores, heads_of_64.grads_summed_scores) == (bf16, bf16)


def test_unsupported_calls_are_refused_with_the_reason():
    inputs = make_inputs(3, batch=1, length=4, heads=2, groups=1)
    arrays = [inputs[n] for n in NAMES[:5]]
    assert api.unsupported(*arrays, interpret=True) is None
    assert "target platform is cpu" in api.unsupported(*arrays)
    assert "float64" in api.unsupported(*arrays[:3], np.zeros((1, 4, 1, 16)), arrays[4],
                                        interpret=True)
    odd = make_inputs(3, batch=1, length=4, heads=2, groups=1, head_dim=6)
    assert "powers of two" in api.unsupported(*(odd[n] for n in NAMES[:5]), interpret=True)
    with pytest.raises(ValueError, match="pallas ssd: .*target platform is cpu"):
        api.ssd(*arrays)


# --- the TPU kernels (TPU interpret mode) ----------------------------------------------------


def test_tpu_documents_initial_state_groups_odd_length():
    """The TPU kernels: 19 steps in chunks of 8 (padded), G = 2 groups of 2 heads, documents
    on and off chunk edges, an initial state, the state in two P tiles: values and every
    gradient against the float64 per-token reference."""
    inputs = make_inputs(0, batch=2, length=19, heads=4, groups=2)
    check_against_reference(inputs, documents(19), backend="tpu")


@pytest.mark.slow
@pytest.mark.parametrize("packed, with_initial, heads, groups, length, blocks", [
    (False, False, 2, 2, 21, TINY), (True, True, 4, 1, 27, TPU_WHOLE_P),
    (True, False, 2, 1, 16, TPU_WHOLE_P),
    (True, True, 4, 2, 29, dataclasses.replace(TINY, segments=2))])
def test_tpu_kernels_match_reference(packed, with_initial, heads, groups, length, blocks):
    """The TPU kernels without documents (the mask-free path) or initial state, G = H and
    G = 1 (4 heads on one group), the whole of P in one tile (the TPU default), a length of
    whole chunks, rows in two sequence segments."""
    inputs = make_inputs(8, batch=2, length=length, heads=heads, groups=groups)
    check_against_reference(inputs, documents(length) if packed else None, with_initial,
                            blocks, backend="tpu")


@pytest.mark.slow
def test_tpu_kernels_lane_views():
    """P = N = 128: the TPU kernels see x and B, C as `[B, T, heads·d]` lane blocks (not
    head-major, as at smaller dims), the state in two P tiles of 64."""
    inputs = make_inputs(5, batch=1, length=13, heads=2, groups=1, head_dim=128, state_dim=128)
    check_against_reference(inputs, documents(13)[:1],
                            blocks=BlockSizes(chunk=8, block_p=64, backward_block_p=64),
                            backend="tpu")


@pytest.mark.slow
def test_tpu_forward_only_bfloat16():
    """The TPU primal forward in bf16: y bf16, final state float32, near the float32 kernel."""
    inputs = make_inputs(2, batch=1, length=13, heads=2, groups=1)
    ids = np.array([[0] * 5 + [1] * 8], np.int32)
    narrow = {n: v.astype(jnp.bfloat16) for n, v in inputs.items()}
    wide = {n: v.astype(jnp.float32) for n, v in narrow.items()}
    run = jax.jit(lambda x: kernel_fn(ids, backend="tpu")(*(x[n] for n in NAMES)))
    y, final = run(narrow)
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    assert_close((y.astype(jnp.float32), final), run(wide), 2e-2, "bf16 vs float32")


def test_tpu_unsupported_calls_are_refused_with_the_reason(monkeypatch):
    inputs = make_inputs(3, batch=1, length=4, heads=2, groups=1)
    arrays = [inputs[n] for n in NAMES[:5]]
    assert api.unsupported(*arrays, backend="tpu", interpret=True) is None
    assert "TPU kernels were asked for, the target platform is cpu" in api.unsupported(
        *arrays, backend="tpu")
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert "must be in (64, 128, 256)" in api.unsupported(*arrays)  # P = 8, N = 16
    wide = make_inputs(3, batch=1, length=4, heads=2, groups=1, head_dim=128, state_dim=256)
    wide = [wide[n] for n in NAMES[:5]]
    assert api.unsupported(*wide) is None
    assert "the TPU kernels take bfloat16, float32" in api.unsupported(
        wide[0].astype(jnp.float16), *wide[1:])
    with pytest.raises(ValueError, match="no split form"):
        kernel_fn(None, blocks=SPLIT, backend="tpu")(*(inputs[n] for n in NAMES))


def test_empty_inputs_are_refused():
    """T = 0: a reason, not a crash in a slice of the kernels."""
    x = make_inputs(0, batch=1, length=0, heads=2, groups=1)
    assert "must not be empty" in api.unsupported(*(x[n] for n in NAMES[:5]), interpret=True)
