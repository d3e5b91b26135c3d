"""Gated delta rule Pallas kernels (interpret mode on CPU) against the per-token reference.

Values (outputs and final state) and gradients of every input (q, k, v, g, β, initial state)
at float32 against `hybrid_jax.ops.gated_delta_rule(implementation="reference")` (a per-token
`lax.scan`, itself checked against a numpy loop in tests/ops) in float64. Tiny tiles (chunk 8,
sub-chunks of 4, two V and two K tiles) so that short sequences span several chunks, the
blocked inverse has off-diagonal blocks and every tile loop runs twice. The GPU kernels are
also lowered to Triton IR at the real head dims (no GPU needed: lowering only).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.ops.delta_rule import gated_delta_rule
from hybrid_jax.ops.segments import document_starts
from pallas_kernels.delta_rule import api
from pallas_kernels.delta_rule.block_sizes import BlockSizes, default_block_sizes
from tests.helpers import assert_close, normals

TINY = BlockSizes(chunk=8, sub_chunk=4, value_block=8, gradient_key_block=8,
                  gradient_value_block=8)
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def make_inputs(seed, batch, length, heads=2, key_dim=16, value_dim=16):
    """q, k (L2-normalised, as the modules pass them), v, g ≤ 0 (a weak and a strong head),
    β in (0, 1), an initial state; float32."""
    q, k, v, g, beta, state = normals(
        seed, (batch, length, heads, key_dim), (batch, length, heads, key_dim),
        (batch, length, heads, value_dim), (batch, length, heads), (batch, length, heads),
        (batch, heads, key_dim, value_dim), dtype=np.float32)
    return dict(q=q, k=k / jnp.linalg.norm(k, axis=-1, keepdims=True), v=v,
                g=-jnp.exp(g) * jnp.asarray([0.1, 1.5], jnp.float32), beta=jax.nn.sigmoid(beta),
                initial_state=state)


def kernel_run(x, segment_ids, scale, blocks, backend=None):
    """The kernels in interpret mode (the GPU's, or `backend`'s)."""
    starts = document_starts("test", segment_ids, *x["q"].shape[:2])
    return api.gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale,
                                initial_state=x.get("initial_state"), starts=starts,
                                block_sizes=blocks, backend=backend, interpret=True)


def reference_run(x, segment_ids, scale):
    x64 = {name: value.astype(jnp.float64) for name, value in x.items()}
    return gated_delta_rule(x64["q"], x64["k"], x64["v"], x64["g"], x64["beta"], scale=scale,
                            initial_state=x64.get("initial_state"), segment_ids=segment_ids,
                            return_final_state=True, implementation="reference")


def weighted_loss(run, weights):
    """Σ o·w_o + Σ S_T·w_S: every output and the final state reach the gradient."""
    def loss(x):
        out, final_state = run(x)
        return (jnp.sum(out * weights[0].astype(out.dtype))
                + jnp.sum(final_state * weights[1].astype(final_state.dtype)))
    return loss


def check_against_reference(x, segment_ids, scale, *, primal: bool, blocks=TINY, backend=None):
    batch, _, heads, key_dim = x["q"].shape
    weights = normals(7, x["v"].shape, (batch, heads, key_dim, x["v"].shape[3]))
    kernel = lambda x: kernel_run(x, segment_ids, scale, blocks, backend)
    reference = lambda x: reference_run(x, segment_ids, scale)
    with_values = lambda run: jax.jit(jax.value_and_grad(
        lambda x: (weighted_loss(run, weights)(x), run(x)), has_aux=True))
    (_, expected), expected_grads = with_values(reference)(x)
    if primal:  # the forward without residuals (no gradient pending)
        assert_close(jax.jit(kernel)(x), expected, 1e-5, "values")
        grads = jax.jit(jax.grad(weighted_loss(kernel, weights)))(x)
    else:  # values from the forward that saves the backward's residuals
        (_, values), grads = with_values(kernel)(x)
        assert_close(values, expected, 1e-5, "values")
    for name in x:
        assert_close(grads[name], expected_grads[name], 1e-5, f"d{name}")


# The GPU defaults' combination from K 128 (`default_block_sizes`), at TINY's tiles.
ROUND_10 = dict(split_gradients=True, inverse_by_block=True, reverse_small_scales=True,
                state_num_stages=1)


@pytest.mark.parametrize("changes,primal", [
    (dict(split_gradients=False), False), (dict(split_gradients=True), False),
    (dict(split_gradients=True, inverse_by_block=True), False),
    (dict(split_outputs=True), True), (dict(split_outputs=True, inverse_by_block=True), False),
    (dict(split_outputs=True, forward_value_block=16, store_state_first=True), False),
    (dict(forward_value_block=4, forward_state_num_warps=2, forward_state_num_stages=1), False),
    (dict(split_gradients=True, reverse_small_scales=True), False),
    (dict(ROUND_10, split_outputs=True, forward_value_block=16), True),
    (dict(ROUND_10, split_outputs=True, outputs_value_block=4), True),
    (dict(ROUND_10, split_outputs=True, forward_state_key_block=4), False),
    (dict(ROUND_10, split_outputs=True, reverse_state_key_block=4), False),
    (dict(split_gradients=True, reverse_state_key_block=4), False),
    (dict(ROUND_10, split_outputs=True, outputs_value_block=4, outputs_key_block=4,
          outputs_num_stages=3), True),
    (dict(ROUND_10, split_outputs=True, forward_value_block=4, forward_state_key_block=4,
          outputs_value_block=8, outputs_key_block=4, outputs_num_stages=3,
          pipelined_key_gradients=True, gradient_num_stages=3), True),
    (dict(split_gradients=True, pipelined_key_gradients=True, gradient_num_stages=2), False),
    (dict(split_gradients=False, pipelined_key_gradients=True), False),
    (dict(split_gradients=True, pipelined_pair_gradients=True, gradient_num_stages=3), False),
    (dict(split_gradients=False, pipelined_pair_gradients=True), False),
    (dict(ROUND_10, split_outputs=True, tf32_merges=True), True),
    (dict(ROUND_10, reverse_in_flight=True, state_num_stages=2), False),
    (dict(ROUND_10, reverse_in_flight=True, reverse_state_key_block=4), False),
    (dict(ROUND_10, split_outputs=True, tf32_merges=True, prepare_loads_first=True), True),
    (dict(prepare_loads_first=True), False)],
    ids=["fused", "split_gradients", "inverse_by_block", "split_outputs",
         "split_outputs_by_block", "forward_tile_state_first", "forward_tile_fused",
         "reverse_small_scales", "round_10_defaults", "outputs_value_tiles",
         "forward_state_key_blocks", "reverse_state_key_blocks",
         "reverse_state_key_blocks_scaled_operands", "outputs_key_blocks", "k256_defaults",
         "pipelined_key_gradients", "pipelined_key_gradients_fused",
         "pipelined_pair_gradients", "pipelined_pair_gradients_fused", "tf32_merges",
         "reverse_in_flight", "reverse_in_flight_key_blocks", "prepare_loads_first",
         "prepare_loads_first_fused"])
def test_documents_initial_state_odd_length(x64, changes, primal):
    """T = 37 (padded to 40, five chunks of 8). Row 0: documents start at 5 (inside a chunk),
    8 (on a chunk edge), 9 (so 8 is a length-1 document), 16, 17 and 23, 24 (length 1),
    and ids are reused (a start is a change of id); row 1: one start at 20 and a length-1
    document at the last step. The initial state reaches the first document only. Both forms
    of the per-chunk gradients (`BlockSizes.split_gradients`), the diagonal blocks of the
    inverse viewed block by block (`BlockSizes.inverse_by_block`) and the outputs made by
    their own kernel from the stored states (`BlockSizes.split_outputs`; values from the
    forward without residuals in one case, from the one saving them in the other); the forward
    sequential pass in V tiles of its own (wider or narrower than the reverse pass's 8), its
    entering states stored before or after its first product; the reverse pass's row scales
    on either side of its products; the output kernel in V tiles; the forward state pass's
    state and the reverse pass's dS as row blocks of 4 keys (the latter with either side of
    the row scales); the key gradients' and the pair gradients' V-tile products as a loop,
    split and fused; the
    inverse's merges as single float32 products (TF32 on a GPU, exact here); the reverse pass
    reading its tiles where first used, q negated, whole and in key blocks of 4; the key
    gradients' dX and dK̃ in one V-tile loop, split and pipelined, fused and unrolled;
    `chunk_prepare` reading every input at its top (the forward's split
    form with TF32 merges, and the fused form saving T for the backward)."""
    x = make_inputs(0, batch=2, length=37)
    ids = np.zeros((2, 37), np.int32)
    for start, doc in ((5, 1), (8, 2), (9, 1), (16, 3), (17, 4), (23, 5), (24, 6)):
        ids[0, start:] = doc
    ids[1, 20:], ids[1, 36:] = 1, 2
    check_against_reference(x, jnp.asarray(ids), 0.4, primal=primal,
                            blocks=dataclasses.replace(TINY, **changes))


def test_one_document_zero_initial_state(x64):
    """No segment ids, no initial state, T a multiple of the chunk; values from the primal
    forward."""
    x = make_inputs(1, batch=1, length=24, key_dim=8, value_dim=8)  # one K and one V tile
    del x["initial_state"]
    check_against_reference(x, None, None, primal=True)


@pytest.mark.parametrize("changes", [
    dict(split_gradients=False), dict(split_gradients=True),
    dict(split_gradients=True, tf32_merges=True),
    dict(split_gradients=True, reverse_small_scales=True, reverse_in_flight=True),
    dict(split_gradients=True, tf32_merges=True, prepare_loads_first=True)],
    ids=["fused", "split_gradients", "tf32_merges", "reverse_in_flight",
         "prepare_loads_first"])
def test_bfloat16_within_rounding(x64, changes):
    """bf16 q, k, v (float32 g, β, state): the bf16 paths of the kernels (the inverse's
    hi/lo split products, U₀'s split T, dK̃'s split dS₁; the split gradients' stored dQK and
    dKK) stay within bf16 rounding of the float64 reference on the same inputs; chunk 16 of
    sub-chunks 4, so the inverse merges its blocks twice (4 → 8 → 16), by split products or
    (`tf32_merges`) by float32 ones."""
    ids = np.zeros((1, 45), np.int32)
    ids[0, 21:] = 1
    check_bfloat16(jnp.asarray(ids), dataclasses.replace(TINY, chunk=16, **changes))


def check_bfloat16(segment_ids, blocks, backend=None):
    """The kernels on bf16 q, k, v (T = 45) within bf16 rounding of the float64 reference on
    the same (bf16-representable) inputs: values from the primal forward, every gradient."""
    x = make_inputs(3, batch=1, length=45)
    x.update({n: x[n].astype(jnp.bfloat16).astype(jnp.float32) for n in ("q", "k", "v")})
    weights = normals(7, x["v"].shape, x["initial_state"].shape)

    def kernel(x):
        x = dict(x, **{n: x[n].astype(jnp.bfloat16) for n in ("q", "k", "v")})
        out, state = kernel_run(x, segment_ids, 0.4, blocks, backend)
        return out.astype(jnp.float32), state

    expected = reference_run(x, segment_ids, 0.4)
    expected_grads = jax.grad(weighted_loss(lambda x: reference_run(x, segment_ids, 0.4),
                                            weights))(x)
    assert_close(jax.jit(kernel)(x), expected, 6e-3, "values")  # measured ≈ 2.6e-3
    grads = jax.jit(jax.grad(weighted_loss(kernel, weights)))(x)
    for name in x:
        assert_close(grads[name], expected_grads[name], 1e-2, f"d{name}")  # ≤ 4.6e-3


@pytest.mark.parametrize("changes,primal", [
    (None, False), (dict(split_gradients=False), True),
    (dict(ROUND_10, split_outputs=True, outputs_value_block=4, forward_state_key_block=8),
     True),
    (dict(ROUND_10, split_outputs=True, forward_state_key_block=8, reverse_state_key_block=4),
     False)], ids=["defaults", "fused", "round_10", "key_blocks"])
def test_wide_values_run_as_slices(x64, monkeypatch, changes, primal):
    """V wider than `VALUE_SLICE` (gdn-340m's V = 512 on the GPU) runs as column slices of the
    state, as extra heads of one call (each kernel launched once) that share q and k through
    the kernels' index maps; here slices of 8 of V = 16, with documents and an initial state;
    every kernel form reading the shared q and k (fused or split outputs and gradients, the
    forward alone, both sequential passes in key blocks)."""
    x = make_inputs(4, batch=1, length=19)
    ids = np.zeros((1, 19), np.int32)
    ids[0, 11:] = 1

    def launches():
        args = [x[n] for n in NAMES[:5]]
        fn = lambda *a: api.gated_delta_rule(*a, initial_state=x["initial_state"],
                                             block_sizes=TINY, interpret=True)
        return str(jax.make_jaxpr(fn)(*args)).count("pallas_call")

    whole = launches()
    monkeypatch.setattr(api, "VALUE_SLICE", 8)
    assert launches() == whole
    blocks = None if changes is None else dataclasses.replace(TINY, **changes)
    check_against_reference(x, jnp.asarray(ids), 0.4, primal=primal, blocks=blocks)


def _platform_gpu(monkeypatch):
    monkeypatch.setattr(api, "_platform", lambda: "gpu")


@pytest.mark.parametrize("key_dim,value_dim,documents,changes", [
    (128, 128, True, dict(split_gradients=False)), (256, 64, False, dict(split_gradients=False)),
    (128, 128, True, {}), (256, 64, False, {}), (128, 128, True, dict(inverse_by_block=True)),
    (128, 128, True, dict(split_outputs=True)), (256, 64, False, dict(split_outputs=True)),
    (128, 128, True, dict(forward_value_block=64, forward_state_num_stages=4,
                          store_state_first=True)),
    (256, 128, False, dict(forward_state_num_warps=4, forward_state_num_stages=1)),
    (256, 64, True, dict(reverse_small_scales=True, state_num_stages=1,
                         forward_state_num_stages=2)),
    (256, 512, True, {}), (128, 256, False, dict(outputs_value_block=64)),
    (256, 256, True, dict(forward_value_block=64, forward_state_key_block=64)),
    (256, 512, True, dict(reverse_state_key_block=64)),
    (256, 512, True, dict(pipelined_key_gradients=True, gradient_num_stages=2)),
    (256, 512, True, dict(pipelined_pair_gradients=True)),
    (128, 128, False, dict(reverse_state_key_block=64, reverse_small_scales=False)),
    (128, 128, True, dict(tf32_merges=True)), (256, 512, True, dict(tf32_merges=True)),
    (256, 512, True, dict(reverse_in_flight=True, state_num_stages=2,
                          reverse_state_key_block=128)),
    (128, 128, False, dict(reverse_in_flight=True, state_num_stages=2)),
    (128, 128, True, dict(tf32_merges=True, prepare_loads_first=True)),
    (256, 512, True, dict(prepare_loads_first=True)),
    (256, 512, True, dict(value_block=32, forward_value_block=32))])  # s34f: B 1's programs
def test_gpu_kernels_lower_to_triton(monkeypatch, key_dim, value_dim, documents, changes):
    """Forward and backward lower for the GPU (Triton IR; compiling needs a GPU) at real head
    dims with the default tiles (the split per-chunk gradients) and the variants, bf16."""
    _platform_gpu(monkeypatch)
    batch, length, heads = 1, 200, 2
    rows = (batch, length, heads)
    arrays = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in [
        (rows + (key_dim,), jnp.bfloat16), (rows + (key_dim,), jnp.bfloat16),
        (rows + (value_dim,), jnp.bfloat16), (rows, jnp.float32), (rows, jnp.float32),
        ((batch, heads, key_dim, value_dim), jnp.float32)]]
    if documents:
        arrays.append(jax.ShapeDtypeStruct((batch, length), jnp.bool_))

    def loss(q, k, v, g, beta, state, starts=None):
        blocks = dataclasses.replace(default_block_sizes(key_dim, value_dim),
                                     **changes)
        out, final_state = api.gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                starts=starts, block_sizes=blocks)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(final_state)

    for fn in (loss, jax.grad(loss, argnums=tuple(range(6)))):
        text = jax.jit(fn).trace(*arrays).lower(lowering_platforms=("cuda",)).as_text()
        assert "xla.gpu.triton" in text


def test_unsupported_calls_name_the_reason(monkeypatch):
    x = make_inputs(2, batch=1, length=8)
    args = [x[n] for n in NAMES[:5]]
    assert "needs a GPU or TPU (platform 'cpu'" in api.unsupported(*args)
    assert api.unsupported(*args, interpret=True) is None
    _platform_gpu(monkeypatch)
    assert "head dim K=16" in api.unsupported(*args)
    for value_dim, reason in ((512, None), (768, None), (384, "head dim V=384")):
        wide_v = make_inputs(2, batch=1, length=8, key_dim=128, value_dim=value_dim)
        found = api.unsupported(*[wide_v[n] for n in NAMES[:5]])
        assert found == reason if reason is None else reason in found
    wide = make_inputs(2, batch=1, length=8, key_dim=128, value_dim=64)
    wide_args = [wide[n] for n in NAMES[:5]]
    assert api.unsupported(*wide_args) is None
    assert "one dtype" in api.unsupported(wide_args[0].astype(jnp.bfloat16), *wide_args[1:])
    assert "initial_state has shape" in api.unsupported(*wide_args, x["initial_state"])
    with pytest.raises(ValueError, match="pallas gated_delta_rule: head dim K=16"):
        api.gated_delta_rule(*args)
    with pytest.raises(ValueError, match="sub_chunk"):
        BlockSizes(chunk=16, sub_chunk=32)
    with pytest.raises(ValueError, match="reverse_state_key_block must be None or a power of "
                                         "two >= 2, got 48"):
        BlockSizes(reverse_state_key_block=48)
    with pytest.raises(ValueError, match="reverse_in_flight needs reverse_small_scales"):
        BlockSizes(reverse_in_flight=True)
    with pytest.raises(ValueError, match="prepare_loads_first must be True or False, got 1"):
        BlockSizes(prepare_loads_first=1)


@pytest.mark.parametrize("key_dim,value_dim,training,tile,split", [
    (128, 128, False, 32, True), (64, 32, False, 32, False), (256, 256, False, 64, True),
    (128, 128, True, 32, True), (256, 64, True, 64, True), (256, 32, True, 32, True),
    (64, 16, True, 16, True)])
def test_default_tiles_follow_the_measurements(key_dim, value_dim, training, tile, split):
    """NOTES.md Rounds 4-6 and 10: below K 128 a forward alone runs fused in V tiles of 64,
    otherwise split, its reverse pass in tiles of 32 (64 above K 128; never wider than V);
    the gradients split, at 4 warps."""
    blocks = default_block_sizes(key_dim, value_dim, training=training)
    assert (blocks.value_block, blocks.split_outputs) == (tile, split)
    assert (blocks.split_gradients, blocks.gradient_num_warps, blocks.inverse_by_block) == (
        True, 4, True)
    assert blocks.state_num_warps == (8 if training and key_dim > 128 else 4)


@pytest.mark.parametrize("key_dim,value_dim,sequences,tiles,alone", [
    (256, 256, 6, (32, 32), dict(value_block=32, forward_value_block=32)),
    (256, 256, 15, (32, 32), dict(value_block=32, forward_value_block=32)),
    (256, 256, 16, (64, 64), {}), (256, 256, None, (64, 64), {}),
    (256, 16, 6, (16, 16), dict(value_block=16, forward_value_block=16)),
    (128, 128, 1, (32, 64), dict(forward_value_block=32)),
    (128, 128, 32, (32, 64), dict(forward_value_block=32)), (128, 128, 33, (32, 64), {}),
    (64, 64, 12, (16, 16), dict(value_block=16)), (64, 64, 31, (16, 16), dict(value_block=16)),
    (64, 64, 32, (32, 64), dict(value_block=32)), (64, 64, 64, (32, 64), dict(value_block=32)),
    (64, 64, 65, (32, 64), {}), (64, 128, 15, (16, 16), dict(value_block=16)),
    (64, 128, 16, (32, 64), dict(value_block=32)), (64, 64, None, (32, 64), {})])
def test_few_sequences_run_in_narrow_value_tiles(key_dim, value_dim, sequences, tiles, alone):
    """Session 35: above K 128, fewer than `FEW_PROGRAMS` programs of 64 value columns run
    both state passes in V tiles of 32, training and a forward alone (gdn-340m at B 1: 6
    sequences of V 256, 24 programs); many sequences keep their tiles. Session 36: below K 128,
    fewer than `FEW_PROGRAMS_BELOW_K128` train both passes in V tiles of 16 (gdn-130m at B 1:
    12 sequences of V 64) and run a forward alone (fused) in 16 too; session 37: a forward
    alone there at up to `FEW_PROGRAMS` runs in 32; at K 128 a forward alone at up to
    `FEW_PROGRAMS` runs its state pass in 32, training keeps its tiles."""
    blocks = default_block_sizes(key_dim, value_dim, sequences=sequences)
    assert (blocks.value_block, blocks.forward_value_block) == tiles
    assert blocks == dataclasses.replace(default_block_sizes(key_dim, value_dim),
                                         value_block=tiles[0], forward_value_block=tiles[1])
    wide = default_block_sizes(key_dim, value_dim, training=False)
    assert default_block_sizes(key_dim, value_dim, sequences=sequences,
                               training=False) == dataclasses.replace(wide, **alone)


def test_the_defaults_count_batch_heads_and_value_slices(monkeypatch):
    """`sequences` is B × H with each V slice a head: the tile rule sees the programs the
    sequential kernels launch."""
    seen = []
    defaults = api.default_block_sizes
    monkeypatch.setattr(api, "default_block_sizes",
                        lambda *a, **kw: seen.append(kw["sequences"]) or defaults(*a, **kw))
    for value_dim, sequences in ((128, 3 * 5), (512, 3 * 5 * 2)):
        rows = (3, 64, 5)
        arrays = [jax.ShapeDtypeStruct(rows + (dim,), jnp.float32)
                  for dim in (16, 16, value_dim)] + [jax.ShapeDtypeStruct(rows, jnp.float32)] * 2
        seen.clear()
        jax.eval_shape(lambda *a: api.gated_delta_rule(*a, interpret=True), *arrays)
        assert set(seen) == {sequences}


@pytest.mark.parametrize("key_dim,value_dim,forward", [
    (128, 128, (64, None, 4)), (128, 32, (32, None, 4)), (256, 512, (64, 4, 2)),
    (64, 64, (None, None, None))])
def test_round_10_defaults(key_dim, value_dim, forward):
    """NOTES.md Round 10: from K 128 the forward state pass has its own launch (V 64 at
    4 stages at K 128; above, V 64 at 4 warps, 2 stages, as row blocks of 64 keys) and the
    reverse pass small scales at 1 stage; the same either way of `training` (below K 128
    training takes V 64 at 4 stages, sessions 17-18); a forward alone
    at K 128 merges the inverse in TF32 (Round 18, session 15); from K 128 the pair gradients
    loop over V tiles, pipelined (Round 21, session 16)."""
    for training in (True, False):
        blocks = default_block_sizes(key_dim, value_dim, training=training)
        # below K 128, training only: V 64 at 4 stages (sessions 17-18, K = V = 64)
        small = key_dim < 128 and training
        assert (blocks.forward_value_block, blocks.forward_state_num_warps,
                blocks.forward_state_num_stages) == ((64, None, 4) if small else forward)
        in_flight = training and key_dim > 128  # Round 22 (session 16)
        assert (blocks.reverse_small_scales, blocks.state_num_stages) == (
            (True, 2 if in_flight else 1) if key_dim >= 128 else (False, 2))
        assert blocks.reverse_in_flight == in_flight
        assert not in_flight or blocks.reverse_state_key_block == 128
        assert blocks.forward_state_key_block == (64 if key_dim > 128 else None)
        # Round 18 measured: the TF32 merges for a forward alone at K 128 only
        assert blocks.tf32_merges == (key_dim == 128 and not training)
        # Round 21 measured (session 16): the pair gradients' pipelined V loop from K 128
        assert blocks.pipelined_pair_gradients == (key_dim >= 128)
        # float32 inputs keep the earlier defaults (V 64 at 4 stages is over shared memory)
        wide = default_block_sizes(key_dim, value_dim, training=training, itemsize=4)
        assert (wide.forward_value_block, wide.forward_state_num_stages,
                wide.forward_state_key_block, wide.reverse_small_scales,
                wide.state_num_stages) == (None, None, None, False, 2)
        assert wide.split_outputs == (training or key_dim > 128)


def test_empty_inputs_are_refused():
    """T = 0: a reason, not a ZeroDivisionError in the kernels."""
    x = make_inputs(0, batch=1, length=0, key_dim=8, value_dim=8)
    reason = api.unsupported(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"],
                             backend="gpu", interpret=True)
    assert "must not be empty" in reason
