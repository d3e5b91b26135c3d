"""The reverse-time backward kernel of the gated delta rule (layout as in `forward.py`;
dO `[B, Tp, H, V]`); the per-chunk gradients that follow it are in `gradients.py`.

  chunk_state_gradients  one program per (batch, head, V tile): the reverse-time pass over
                         chunks, dS in registers (whole, or as row blocks of keys): dU of
                         every chunk, the gradient of the state after every chunk, the initial
                         state's gradient

Per chunk (NOTES.md), with dS₁ the gradient of the state after it:

    dU  = Pᵀ dO + K̃ dS₁,   dS₀ = e^{Γ_C} dS₁ + Q̃ᵀ dO − Wᵀ dU
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.chunk_sums import chunk_cumsum
from pallas_kernels.delta_rule.chunk_math import F32, cumulative_decays
from pallas_kernels.delta_rule.layout import (
    SequentialSpecs,
    chunk_loop,
    load_decays,
    split_refs,
    with_starts,
)
from pallas_kernels.delta_rule.static import Static
from pallas_kernels.matmul import mm, mm_tn


def _state_gradients_kernel(*refs, st: Static, num_chunks: int):
    (q_ref, k_ref, w_ref, p_ref, do_ref, log_decay_ref), docs_ref, rest = split_refs(
        refs, 6, st.documents)
    d_final_ref, du_ref, d_states_ref, d_initial_ref = rest
    C, key_dim = st.blocks.chunk, k_ref.shape[-1]
    # dS as row blocks `[block, V tile]` (`BlockSizes.reverse_state_key_block`; one block: the
    # whole [K, V tile]), each with its column tiles of q, k and W.
    block = min(st.blocks.reverse_state_key_block or key_dim, key_dim)
    rows = lambda i: pl.ds(i * block, block)
    num_blocks = key_dim // block
    op = k_ref.dtype

    def load(c):
        span = pl.ds(c * C, C)
        x = {name: [ref[span, rows(i)] for i in range(num_blocks)]
             for name, ref in (("q", q_ref), ("k", k_ref), ("w", w_ref))}
        return dict(x, p=p_ref[span, :], do=do_ref[span, :],
                    chunk=load_decays(log_decay_ref, docs_ref, c, C))

    def step(c, d_state, x):
        # The chain to the previous chunk is K̃ dS → dU → Wᵀ dU; the rest only needs loads.
        chunk = x["chunk"]
        keys, queries, d_out = _scaled_operands(x, chunk, st, op)
        read = None  # K̃ dS = Σᵢ K̃[:, block i] dSᵢ, each block stored before its product
        for i, (d_block, keys_block) in enumerate(zip(d_state, keys, strict=True)):
            d_states_ref[pl.ds(c * key_dim + i * block, block), :] = d_block
            part = mm(keys_block, d_block.astype(op))
            read = part if read is None else read + part
        if st.blocks.reverse_small_scales:
            read = chunk.to_end[:, None] * read
        du_op = (mm_tn(x["p"], x["do"]) + read).astype(op)  # dU = Pᵀ dO + K̃ dS
        du_ref[pl.ds(c * C, C), :] = du_op
        # dSᵢ ← e^{Γ_C} dSᵢ + Q̃ᵢᵀ dO − Wᵢᵀ dU written as sums only (−dU is exact), so Triton
        # folds both into the products' accumulator: Q̃ᵀ dO and Wᵀ dU are no float32 tiles of
        # their own beside dS (ptxas, K 256, 8 warps: 232 B of spills → none; NOTES.md Round 15).
        minus_du = -du_op
        return tuple(chunk.decay * d_block + mm_tn(q, d_out) + mm_tn(w, minus_du)
                     for d_block, q, w in zip(d_state, queries, x["w"], strict=True))

    def step_in_flight(c, d_state):
        # `BlockSizes.reverse_in_flight`: each tile read at its first use, after dS's stores, so
        # that at 2 stages the pipeliner's one wait for k, P, dO and W (issued a step ahead)
        # comes after the stores, not at the step's top (NOTES.md Round 22). q reaches its
        # product negated, an elementwise op: the pipeliner brings it through registers, not a
        # fifth pair of shared buffers (over the H200's 227 KB at K 256). Q̃ᵀ dO = (−q)ᵀ(−dO ⊙
        # scale·e^Γ) is the same products exactly; the row scales as `reverse_small_scales`'.
        span, last = pl.ds(c * C, C), c * C + C - 1
        # Γ and n at the chunk's end first: their register-path loads then wait behind stores.
        lasts = log_decay_ref[last], None if docs_ref is None else docs_ref[last]
        for i, d_block in enumerate(d_state):
            d_states_ref[pl.ds(c * key_dim + i * block, block), :] = d_block
        read = None  # K̃ dS = Σᵢ K̃[:, block i] dSᵢ (e^{Γ_C − Γ} applied after the sum)
        for i, d_block in enumerate(d_state):
            part = mm(k_ref[span, rows(i)], d_block.astype(op))
            read = part if read is None else read + part
        chunk = cumulative_decays(log_decay_ref[span], lasts[0],
                                  None if docs_ref is None else docs_ref[span], lasts[1])
        d_out = do_ref[span, :]
        minus_out = (d_out * (-st.scale * chunk.entry)[:, None]).astype(op)
        d_state = tuple(chunk.decay * d_block + mm_tn(-q_ref[span, rows(i)], minus_out)
                        for i, d_block in enumerate(d_state))
        du_op = (mm_tn(p_ref[span, :], d_out) + chunk.to_end[:, None] * read).astype(op)
        du_ref[span, :] = du_op
        minus_du = -du_op
        return tuple(d_block + mm_tn(w_ref[span, rows(i)], minus_du)
                     for i, d_block in enumerate(d_state))

    d_final = tuple(d_final_ref[rows(i), :] for i in range(num_blocks))
    if st.blocks.reverse_in_flight:
        d_initial = jax.lax.fori_loop(0, num_chunks,
                                      lambda i, d: step_in_flight(num_chunks - 1 - i, d), d_final)
    else:
        d_initial = chunk_loop(num_chunks, load, step, d_final, reverse=True)
    for i, d_block in enumerate(d_initial):
        d_initial_ref[rows(i), :] = d_block


def _scaled_operands(x: dict, chunk, st: Static, op):
    """The operands of K̃ dS and Q̃ᵀ dO: (key column tiles, query column tiles, dO). K̃ and Q̃
    as the forward rounds them, or with `reverse_small_scales` k and q as loaded and the row
    scales on the `[C, V tile]` side (dO here, K dS by the caller)."""
    to_queries = st.scale * chunk.entry
    if st.blocks.reverse_small_scales:
        return x["k"], x["q"], (x["do"] * to_queries[:, None]).astype(op)
    scaled = lambda tiles, scale: [(t * scale[:, None]).astype(op) for t in tiles]
    return scaled(x["k"], chunk.to_end), scaled(x["q"], to_queries), x["do"]


def chunk_state_gradients(q, k, w, p, g, starts, d_out, d_final, st: Static):
    """The reverse-time pass. Returns dU `[B, Tp, H, V]` (input dtype), the gradients of the
    state after every chunk `[B, H, NC·K, V]` and of the initial state (float32: in bf16 they
    cost dg an order of magnitude, NOTES.md)."""
    batch, length, heads, value_dim = d_out.shape
    key_dim, C, tile = q.shape[-1], st.blocks.chunk, st.blocks.value_block
    num_chunks = length // C
    specs = SequentialSpecs(length, tile, st.key_group)
    docs = None if starts is None else chunk_cumsum(starts, C)
    in_specs, args = with_starts(
        [specs.shared_whole(key_dim), specs.shared_whole(key_dim), specs.shared_whole(key_dim),
         specs.shared_whole(C), specs.tiled(), specs.shared_steps()],
        [q, k, w, p, d_out, chunk_cumsum(g, C)], specs.starts(), docs, st.documents)
    blocks = st.blocks
    return pallas_call(
        functools.partial(_state_gradients_kernel, st=st, num_chunks=num_chunks),
        grid=(batch, heads, value_dim // tile), in_specs=in_specs + [specs.state(key_dim)],
        out_specs=[specs.tiled(), specs.state(num_chunks * key_dim), specs.state(key_dim)],
        out_shape=[jax.ShapeDtypeStruct(d_out.shape, k.dtype),
                   jax.ShapeDtypeStruct((batch, heads, num_chunks * key_dim, value_dim), F32),
                   jax.ShapeDtypeStruct(d_final.shape, F32)],
        compiler_params=triton_params(blocks.state_num_warps, blocks.state_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_state_gradients",
    )(*args, d_final)
