"""Forward kernels of the gated delta rule (Pallas, Triton lowering on GPUs).

Layout: q, k `[B, Tp, H, K]`, v `[B, Tp, H, V]` (time padded to a multiple of the chunk C),
g and β `[B, H, Tp]` float32, document starts `[B, Tp]` float32 (1.0 at a start) when the call
has documents (the sequential kernels read the sums of g and of the starts within each chunk,
`chunk_sums.chunk_cumsum`), states `[B, H, K, V]` float32. Per-chunk intermediates are in the
input dtype: W `[B, Tp, H, K]`, U₀ and U `[B, Tp, H, V]`, P and T `[B, Tp, H, C]` (row t of
its chunk's C×C matrix), the states entering each chunk `[B, H, NC·K, V]`; the backward's
gradients of the states after each chunk are float32 (`backward.py`).

  chunk_prepare             one program per (batch, head, chunk): P, T, W, U₀
  chunk_states_and_outputs  one program per (batch, head, V tile): the sequential pass over
                            chunks, the state in registers, the outputs of every chunk
  chunk_states              (`BlockSizes.split_outputs`) the same pass carrying only the state:
                            stores the states entering each chunk and U
  chunk_outputs             (`BlockSizes.split_outputs`) one program per (batch, head, chunk):
                            the outputs from those
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.chunk_sums import chunk_cumsum
from pallas_kernels.delta_rule.chunk_math import (
    F32,
    chunk_decays,
    iota,
    lower_inverse,
    split_rows,
)
from pallas_kernels.delta_rule.layout import (
    ChunkSpecs,
    SequentialSpecs,
    ValueTileSpecs,
    load_decays,
    split_refs,
    with_starts,
)
from pallas_kernels.delta_rule.static import Static
from pallas_kernels.matmul import mm, mm_nt, mm_tn


def _prepare_kernel(*refs, st: Static, save: bool):
    (q_ref, k_ref, v_ref, g_ref, beta_ref), starts_ref, outs = split_refs(refs, 5, st.documents)
    w_ref, u0_ref, p_ref = outs[:3]
    op = k_ref.dtype
    width = v_ref.shape[-1] // st.key_group  # U₀ a value head (V slice) at a time
    first = st.blocks.prepare_loads_first
    if first:
        # Every input read at the top, in one batch, before any product or store: the
        # compiler keeps a load after a store to another output (they could alias), and so
        # each later read was a global round trip on the program's chain (NOTES.md session
        # 19). v (its first slice) waits in shared memory; T, when saved, is stored as soon
        # as made (fewer registers live beside the loaded tiles).
        q, k, g, beta = q_ref[...], k_ref[...], g_ref[...], beta_ref[...]
        starts = None if starts_ref is None else starts_ref[...]
        v_first = v_ref[:, pl.ds(0, width)]
        chunk = chunk_decays(g, starts)
    else:
        chunk = chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
        k = k_ref[...]
    pairs = chunk.pairs()
    p_ref[...] = (st.scale * mm_nt(q if first else q_ref[...], k) * pairs).astype(op)
    if not first:
        beta = beta_ref[...]
    kk = mm_nt(k, k)  # symmetric: A and (for the whole-tile inverse) Aᵀ from the same tile
    # A from P's decays (the strict mask where used: fewer exponentials, fewer instructions).
    lower = iota(pairs.shape, 0) > iota(pairs.shape, 1)
    a = jnp.where(lower, beta[:, None] * kk * pairs, 0.0)
    # The inverse block by block needs no Aᵀ (half the exponentials; NOTES.md, Round 4).
    a_t = (None if st.blocks.inverse_by_block
           else beta[None, :] * kk * chunk.pairs(strict=True, transposed=True))
    t = lower_inverse(a, a_t, st.blocks.sub_chunk, op, single=st.blocks.tf32_merges)
    if save and first:
        outs[3][...] = t.astype(op)
    # The row scales of the right-hand sides go onto T's columns (W = T diag(β e^Γ) K), so K
    # and V reach the products as loaded. U₀ = T diag(β) V to ≈ float32 accuracy (V is exact
    # in its dtype): U = U₀ − W S nearly cancels once the state holds v, and a bf16 T there
    # costs dg an order of magnitude (NOTES.md).
    w_ref[...] = mm((t * (beta * chunk.entry)[None, :]).astype(op), k).astype(op)
    # U₀ slice by slice (the value heads of this key head): a [C, V slice] result at a time.
    for s in range(st.key_group):
        span = pl.ds(s * width, width)
        u0_ref[:, span] = split_rows(t * beta[None, :], v_first if first and s == 0
                                     else v_ref[:, span]).astype(op)
    if save and not first:
        outs[3][...] = t.astype(op)


def chunk_prepare(q, k, v, g, beta, starts, st: Static, *, save: bool):
    """Per chunk, in parallel: P = scale·(Q Kᵀ) ⊙ D, T = (I + A)⁻¹, W = T (β e^Γ ⊙ K),
    U₀ = T (β ⊙ V) (NOTES.md). Returns (W, U₀, P), and T when `save` (the backward's).
    One program per key head: W, P and T once for its `key_group` value heads (the V slices:
    `[B, Tp, H, V]` viewed as `[B, Tp, H / group, group·V]`, U₀ the same way back)."""
    batch, length, heads, key_dim = q.shape
    C = st.blocks.chunk
    v = v.reshape(batch, length, heads, -1)
    value_dim = v.shape[-1]
    specs = ChunkSpecs(C)
    in_specs, args = with_starts(
        [specs.rows(key_dim), specs.rows(key_dim), specs.rows(value_dim), specs.steps(),
         specs.steps()], [q, k, v, g, beta], specs.starts(), starts, st.documents)
    shape = lambda d: jax.ShapeDtypeStruct((batch, length, heads, d), k.dtype)
    out_specs = [specs.rows(key_dim), specs.rows(value_dim), specs.rows(C)]
    out_specs += [specs.rows(C)] * save
    out_shape = [shape(key_dim), shape(value_dim), shape(C)] + [shape(C)] * save
    blocks = st.blocks
    w, u0, *rest = pallas_call(
        functools.partial(_prepare_kernel, st=st, save=save),
        grid=(batch, heads, length // C), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=triton_params(blocks.prepare_num_warps, blocks.prepare_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_prepare",
    )(*args)
    return (w, u0.reshape(batch, length, heads * st.key_group, -1), *rest)


def _states_kernel(*refs, st: Static, save: bool, outputs: bool, num_chunks: int):
    names = ("q", "k", "w", "u0", "p", "log_decay") if outputs else ("k", "w", "u0", "log_decay")
    ins, docs_ref, rest = split_refs(refs, len(names), st.documents)
    sources = dict(zip(names, ins, strict=True))
    init_ref, *outs = rest
    o_ref = outs.pop(0) if outputs else None
    final_ref, *saved = outs
    C, key_dim = st.blocks.chunk, sources["k"].shape[-1]
    op = sources["k"].dtype

    block = st.blocks.forward_state_key_block  # split outputs only (`BlockSizes`)
    if block is not None and block < key_dim:
        _blocked_state_pass(sources, docs_ref, init_ref, final_ref, saved, st,
                            num_chunks, block)
        return

    def step(c, state):
        # The chain to the next chunk is W S → U → K̃ᵀ U, the outputs hang off it. Each tile
        # is read where it is first used (U₀ after W S, Γ and n after U's store): Triton's
        # pipeliner waits for all of a chunk's loads before the first use of any, so a read
        # at the top of the step put that wait there, before the state's store (NOTES.md
        # Round 17; fla's comes after it).
        span, entering = pl.ds(c * C, C), pl.ds(c * key_dim, key_dim)
        state_op = state.astype(op)
        early = save and st.blocks.store_state_first
        if early:  # before the chain's first product, while the chunk's loads are in flight
            saved[0][entering, :] = state_op
        ws = mm(sources["w"][span, :], state_op)
        u_op = (sources["u0"][span, :].astype(F32) - ws).astype(op)
        if save:
            states_ref, u_ref = saved
            if not early:
                states_ref[entering, :] = state_op
            u_ref[span, :] = u_op
        chunk = load_decays(sources["log_decay"], docs_ref, c, C)
        if outputs:
            q, p = sources["q"][span, :], sources["p"][span, :]
            o_ref[span, :] = _outputs(mm(q, state_op), p, u_op, chunk, st.scale
                                      ).astype(o_ref.dtype)
            # The fused form scales K's rows: on U its pipelined tiles need 238 KB of shared
            # memory at K = 256 (NOTES.md, Round 5).
            return chunk.decay * state + mm_tn(
                (sources["k"][span, :] * chunk.to_end[:, None]).astype(op), u_op)
        # Carrying only the state, K̃ᵀ U is made as Kᵀ (e^{Γ_C − Γ} ⊙ U): the row scale on
        # the [C, V tile] operand, half of K̃'s elements (fewer instructions a step, same
        # errors).
        updates = (u_op * chunk.to_end[:, None]).astype(op)
        return chunk.decay * state + mm_tn(sources["k"][span, :], updates)

    final_ref[...] = jax.lax.fori_loop(0, num_chunks, step, init_ref[...])


def _blocked_state_pass(sources, docs_ref, init_ref, final_ref, saved, st: Static,
                        num_chunks: int, block: int):
    """`chunk_states`' loop with the state as K / `block` row blocks `[block, V tile]` (fla's
    form): each block's bf16 copy is stored as it is made, before W S, so that no
    `[K, V tile]` bf16 copy, its layout conversion and store addresses are live beside the
    float32 state (ptxas, K 256, V 64, 4 warps, 2 stages: 255 registers + 248 B of spills →
    252, none)."""
    C, key_dim = st.blocks.chunk, sources["k"].shape[-1]
    op = sources["k"].dtype
    states_ref, u_ref = saved
    rows = lambda i: pl.ds(i * block, block)

    def step(c, state):
        span = pl.ds(c * C, C)
        state_ops = []
        for i, s in enumerate(state):
            s_op = s.astype(op)
            states_ref[pl.ds(c * key_dim + i * block, block), :] = s_op
            state_ops.append(s_op)
        ws = None  # W S = Σ_i W[:, block i] S_i; Triton folds each sum into the next product
        for i, s_op in enumerate(state_ops):
            p = mm(sources["w"][span, rows(i)], s_op)
            ws = p if ws is None else ws + p
        u_op = (sources["u0"][span, :].astype(F32) - ws).astype(op)
        u_ref[span, :] = u_op
        # Γ and n read after W S: the pipeliner's one wait for the chunk's loads goes before
        # their first use, so reading them first put it at the top of the step, before the
        # state stores (fla's wait comes after its state stores). Forward 0.97 → 0.86 ms at
        # gdn-340m (NOTES.md Round 16).
        chunk = load_decays(sources["log_decay"], docs_ref, c, C)
        updates = (u_op * chunk.to_end[:, None]).astype(op)
        return tuple(chunk.decay * s + mm_tn(sources["k"][span, rows(i)], updates)
                     for i, s in enumerate(state))

    init = tuple(init_ref[rows(i), :] for i in range(key_dim // block))
    final = jax.lax.fori_loop(0, num_chunks, step, init)
    for i, s in enumerate(final):
        final_ref[rows(i), :] = s


def _outputs(q_state, p, u_op, chunk, scale: float):
    """o = Q̃ S₀ + P U of one chunk, float32, from q_state = Q S₀ (the query operand as
    loaded): Q̃'s row scale e^Γ·scale goes on the product."""
    return (scale * chunk.entry)[:, None] * q_state + mm(p, u_op)


def _sequential_call(arrays: dict, g, starts, initial_state, st: Static, *, save: bool,
                     outputs: bool):
    """The sequential pass over `arrays` (q, k, w, u0, p, or k, w, u0 without the outputs)
    and Γ and n (`chunk_cumsum`) of g and the starts; returns ([o], final state, [states, U])."""
    k, u0 = arrays["k"], arrays["u0"]
    batch, length, heads, value_dim = u0.shape
    blocks = st.blocks
    key_dim, C = k.shape[-1], blocks.chunk
    tile = blocks.forward_value_block or blocks.value_block
    num_chunks = length // C
    arrays = dict(arrays, log_decay=chunk_cumsum(g, C))
    docs = None if starts is None else chunk_cumsum(starts, C)
    specs = SequentialSpecs(length, tile, st.key_group)
    shared = specs.shared_whole
    spec_of = dict(q=shared(key_dim), k=shared(key_dim), w=shared(key_dim), u0=specs.tiled(),
                   p=shared(C), log_decay=specs.shared_steps())
    in_specs, args = with_starts([spec_of[name] for name in arrays], list(arrays.values()),
                                 specs.starts(), docs, st.documents)
    out_specs = [specs.tiled()] * outputs + [specs.state(key_dim)]
    out_shape = [jax.ShapeDtypeStruct(u0.shape, k.dtype)] * outputs + [
        jax.ShapeDtypeStruct(initial_state.shape, F32)]
    if save:
        out_specs += [specs.state(num_chunks * key_dim), specs.tiled()]
        out_shape += [jax.ShapeDtypeStruct((batch, heads, num_chunks * key_dim, value_dim),
                                           k.dtype), jax.ShapeDtypeStruct(u0.shape, k.dtype)]
    name = "chunk_states_and_outputs" if outputs else "chunk_states"
    return pallas_call(
        functools.partial(_states_kernel, st=st, save=save, outputs=outputs,
                          num_chunks=num_chunks),
        grid=(batch, heads, value_dim // tile), in_specs=in_specs + [specs.state(key_dim)],
        out_specs=out_specs, out_shape=out_shape,
        compiler_params=triton_params(blocks.forward_state_num_warps or blocks.state_num_warps,
                                        blocks.forward_state_num_stages
                                        or blocks.state_num_stages),
        interpret=st.interpret, name=f"gated_delta_rule_{name}",
    )(*args, initial_state)


def chunk_states_and_outputs(q, k, w, u0, p, g, starts, initial_state, st: Static, *,
                             save: bool):
    """The sequential pass (NOTES.md): per chunk U = U₀ − W S, o = Q̃ S + P U,
    S ← e^{Γ_C} S + K̃ᵀ U. Returns (o in q's dtype, final state float32), and when `save` the
    states entering each chunk and U (input dtype)."""
    return _sequential_call(dict(q=q, k=k, w=w, u0=u0, p=p), g, starts, initial_state, st,
                            save=save, outputs=True)


def chunk_states(k, w, u0, g, starts, initial_state, st: Static):
    """The sequential pass carrying only the state (`BlockSizes.split_outputs`, NOTES.md
    Round 5): per chunk U = U₀ − W S, S ← e^{Γ_C} S + K̃ᵀ U. Returns (final state float32,
    the states entering each chunk, U (input dtype)); `chunk_outputs` makes o from them."""
    return _sequential_call(dict(k=k, w=w, u0=u0), g, starts, initial_state, st,
                            save=True, outputs=False)


def _outputs_kernel(*refs, st: Static):
    (q_ref, p_ref, u_ref, states_ref, g_ref), starts_ref, (o_ref,) = split_refs(
        refs, 5, st.documents)
    decays = lambda: chunk_decays(g_ref[...], None if starts_ref is None else starts_ref[...])
    key_dim, block = q_ref.shape[-1], st.blocks.outputs_key_block
    if block is None or block >= key_dim:
        q, p, state, u = q_ref[...], p_ref[...], states_ref[...], u_ref[...]
        chunk = decays()
        o_ref[...] = _outputs(mm(q, state), p, u, chunk, st.scale).astype(o_ref.dtype)
        return

    def key_block(i, acc):  # Q S₀ over key blocks: each block's q and state tiles pipelined
        cols = pl.ds(pl.multiple_of(i * block, block), block)
        return acc + mm(q_ref[:, cols], states_ref[cols, :])

    # The decays (g's loads and scan) after the loop: read first, they delayed the loop's
    # first cp.async loads by a global load and the scan's barriers (fla reads g after it).
    qs = jax.lax.fori_loop(0, key_dim // block, key_block,
                           jnp.zeros((q_ref.shape[0], o_ref.shape[-1]), F32))
    chunk = decays()
    o_ref[...] = _outputs(qs, p_ref[...], u_ref[...], chunk, st.scale).astype(o_ref.dtype)


def chunk_outputs(q, p, u, states, g, starts, st: Static):
    """o = Q̃ S₀ + P U per chunk, in parallel (one program per batch, head, chunk and V tile of
    `outputs_value_block`), from the states entering each chunk and U that `chunk_states`
    stored. Returns o in q's dtype."""
    batch, length, heads, value_dim = u.shape
    key_dim, C = q.shape[-1], st.blocks.chunk
    tile = st.blocks.outputs_value_block or value_dim
    specs = ValueTileSpecs(C, value_dim // tile, st.key_group)
    in_specs, args = with_starts(
        [specs.shared_rows(key_dim), specs.shared_rows(C), specs.value_rows(tile),
         specs.state(key_dim, tile), specs.shared_steps()], [q, p, u, states, g], specs.starts(),
        starts, st.documents)
    blocks = st.blocks
    return pallas_call(
        functools.partial(_outputs_kernel, st=st),
        grid=(batch, heads, length // C * specs.tiles), in_specs=in_specs,
        out_specs=specs.value_rows(tile), out_shape=jax.ShapeDtypeStruct(u.shape, q.dtype),
        compiler_params=triton_params(blocks.outputs_num_warps, blocks.outputs_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_outputs",
    )(*args)
