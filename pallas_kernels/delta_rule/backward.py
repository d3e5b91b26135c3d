"""The reverse-time backward kernel of the gated delta rule (layout as in `forward.py`;
dO `[B, Tp, H, V]`); the per-chunk gradients that follow it are in `gradients.py`.

  chunk_state_gradients  one program per (batch, head, V tile): the reverse-time pass over
                         chunks, dS in registers: dU of every chunk, the gradient of the state
                         after every chunk, the initial state's gradient

Per chunk (NOTES.md), with dS₁ the gradient of the state after it:

    dU  = Pᵀ dO + K̃ dS₁,   dS₀ = e^{Γ_C} dS₁ + Q̃ᵀ dO − Wᵀ dU
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

from pallas_kernels.call import pallas_call
from pallas_kernels.delta_rule.chunk_math import F32
from pallas_kernels.delta_rule.layout import (
    SequentialSpecs,
    chunk_cumsum,
    chunk_loop,
    load_chunk,
    split_refs,
    with_starts,
)
from pallas_kernels.delta_rule.static import Static, compiler_params
from pallas_kernels.matmul import mm, mm_tn


def _state_gradients_kernel(*refs, st: Static, num_chunks: int):
    (q_ref, k_ref, w_ref, p_ref, do_ref, log_decay_ref), docs_ref, rest = split_refs(
        refs, 6, st.documents)
    d_final_ref, du_ref, d_states_ref, d_initial_ref = rest
    C, key_dim = st.blocks.chunk, k_ref.shape[-1]
    op = k_ref.dtype
    sources = dict(q=q_ref, k=k_ref, w=w_ref, p=p_ref, do=do_ref, log_decay=log_decay_ref)

    def step(c, d_state, x):
        # The chain to the previous chunk is K̃ dS → dU → Wᵀ dU; the rest only needs loads.
        chunk = x["chunk"]
        d_states_ref[pl.ds(c * key_dim, key_dim), :] = d_state
        to_queries = st.scale * chunk.entry
        if st.blocks.reverse_small_scales:  # the row scales on the [C, V tile] side
            read = chunk.to_end[:, None] * mm(x["k"], d_state.astype(op))  # K̃ dS
            d_queries = mm_tn(x["q"], (x["do"] * to_queries[:, None]).astype(op))  # Q̃ᵀ dO
        else:
            keys = (x["k"] * chunk.to_end[:, None]).astype(op)  # K̃ as the forward rounds it
            read = mm(keys, d_state.astype(op))
            d_queries = mm_tn((x["q"] * to_queries[:, None]).astype(op), x["do"])
        du_op = (mm_tn(x["p"], x["do"]) + read).astype(op)  # dU = Pᵀ dO + K̃ dS
        du_ref[pl.ds(c * C, C), :] = du_op
        return chunk.decay * d_state + (d_queries - mm_tn(x["w"], du_op))

    d_initial_ref[...] = chunk_loop(num_chunks, lambda c: load_chunk(sources, docs_ref, c, C),
                                    step, d_final_ref[...], reverse=True)


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
        compiler_params=compiler_params(blocks.state_num_warps, blocks.state_num_stages),
        interpret=st.interpret, name="gated_delta_rule_chunk_state_gradients",
    )(*args, d_final)
