"""NHA kernels for NVIDIA GPUs: Pallas with the Triton lowering (see NOTES.md for why).

Layout `[batch, time, heads, dim]`, time padded to a multiple of the tiles. Forward:
`chunk_prepare` (one program per chunk: gate cumsum and the chunk's writes) and `chunk_scan`
(an elementwise pass over chunks per feature tile) store the slot states at chunk boundaries;
`slot_logits` (one program per chunk and head, `chunk_math`) writes the slot logits;
`window_attention` (one program per query block and head) starts its online softmax from them
and visits only the key blocks that intersect the block's windows — in three parts, the blocks
every row sees in full (inside its window and document) without a mask between the masked
ones at the band's edges (`band_loop`; the backward kernels likewise), its logits in base 2
(`scale·log₂e`, one `ex2` an element; the log-sum-exp it hands the slot kernels is natural);
`slot_readout_add` adds the slot values with the final weights. Slot and window work live in
separate kernels: fused, the slot tiles spilled registers (NOTES.md, v1).

The per-chunk slot kernels are shared with the TPU (`slot_kernels.py`, bound here to the GPU
layout); the window kernels and the chunk scan are GPU-specific (loops inside a program).
Every function takes `Static` (the call's static configuration) and works on padded arrays;
`api.py` does the delaying, padding and the custom VJP.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.band_loop import band_loop, ceil_div
from pallas_kernels.base2 import LOG2E, exp
from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.nha import slot_kernels
from pallas_kernels.nha.chunk_math import F32, MASK_VALUE, iota, window_mask
from pallas_kernels.nha.layout import Layout, Static, in_softmax, slot_rows
from pallas_kernels.nha.slot_kernels import SlotDocs


def _forward_params(st: Static):
    return triton_params(st.blocks.num_warps, st.blocks.num_stages)


def _backward_params(st: Static):
    return triton_params(st.blocks.backward_num_warps, st.blocks.backward_num_stages)


LAYOUT = Layout(
    head_major=False,
    params=lambda st, warps, num_axes, sequential_last, stages: triton_params(warps, stages),
    interpret=lambda st: st.interpret,
    cumsum=lambda x: jnp.cumsum(x, axis=0),
    reverse_cumsum=lambda x: jnp.sum(x, axis=0, keepdims=True) - jnp.cumsum(x, axis=0) + x,
    split_paths=True,
)

chunk_prepare = functools.partial(slot_kernels.chunk_prepare, layout=LAYOUT)
chunk_deltas_reverse = functools.partial(slot_kernels.chunk_deltas_reverse, layout=LAYOUT)
slot_logits = functools.partial(slot_kernels.slot_logits, layout=LAYOUT)
slot_readout_add = functools.partial(slot_kernels.slot_readout_add, layout=LAYOUT)
slot_readout = functools.partial(slot_kernels.slot_readout, layout=LAYOUT)
slot_backward_queries = functools.partial(slot_kernels.slot_backward_queries, layout=LAYOUT)
backward_slot_inputs = functools.partial(slot_kernels.backward_slot_inputs, layout=LAYOUT)


def chunk_scan(deltas, log_decay, st: Static, *, reverse: bool, initial=None):
    """Slot states at chunk boundaries from per-chunk writes, for each of `deltas` (e.g. ΔK̃
    and ΔṼᵀ, `[B, NC, G, X, M]` float32) under the shared log decays `[B, NC, G, 1, M]`, each
    in place of its delta: forward, entry c is the state entering chunk c
    (`S_{c+1} = S_c·e^{G_last,c} + Δ_c`, S_0 = `initial` or 0); reverse, the gradient of the
    state after chunk c (`D_{c−1} = D_c·e^{G_last,c} + Δ_c`, D_{NC−1} = `initial` or 0).
    Returns (states, finals): finals `[B, G, X, M]` are S_NC (forward) or D_{−1}, the gradient
    of the state entering chunk 0 (reverse). Deltas of one width share a kernel."""
    out, finals = list(deltas), list(deltas)
    if initial is None:
        initial = [jnp.zeros(d.shape[:1] + d.shape[2:], F32) for d in deltas]
    for width in sorted({d.shape[3] for d in deltas}):
        same = [i for i, d in enumerate(deltas) if d.shape[3] == width]
        states, last = _chunk_scan([deltas[i] for i in same], log_decay,
                                   [initial[i] for i in same], st, reverse)
        for i, state, final in zip(same, states, last, strict=True):
            out[i], finals[i] = state, final
    return tuple(out), tuple(finals)


def _chunk_scan(deltas, log_decay, initial, st: Static, reverse: bool):
    """A sequential loop over chunks per feature tile and batch·kv head. Each iteration issues
    the loads of `state_group` chunk steps (over all deltas) ahead of their multiply-adds, so
    that their latencies overlap (one load per step measured ≈ 10 µs per chunk step, NOTES.md)."""
    n = len(deltas)
    batch, num_chunks, kv_heads, width, slots = deltas[0].shape
    tile = min(st.blocks.state_block, width)
    steps = math.gcd(max(st.blocks.state_group // n, 1), num_chunks)  # per iteration

    def kernel(*refs):
        delta_refs, decay_ref = refs[:n], refs[n]
        init_refs, out_refs, final_refs = refs[n + 1:2 * n + 1], refs[2 * n + 1:3 * n + 1], \
            refs[3 * n + 1:]

        def iteration(i, states):
            chunks = [i * steps + j for j in range(steps)]
            chunks = [num_chunks - 1 - c for c in chunks] if reverse else chunks
            updates = [[ref[pl.ds(c, 1), :, :] for ref in delta_refs] for c in chunks]
            decays = [exp(decay_ref[pl.ds(c, 1), :, :]) for c in chunks]
            for c, update, decay in zip(chunks, updates, decays, strict=True):
                for ref, state in zip(out_refs, states, strict=True):
                    ref[pl.ds(c, 1), :, :] = state
                states = tuple(s * decay + u for s, u in zip(states, update, strict=True))
            return states

        states = lax.fori_loop(0, num_chunks // steps, iteration,
                               tuple(ref[...] for ref in init_refs))
        for ref, state in zip(final_refs, states, strict=True):
            ref[...] = state

    spec = pl.BlockSpec((None, num_chunks, None, tile, slots), lambda b, h, t: (b, 0, h, t, 0))
    one = pl.BlockSpec((None, 1, None, tile, slots), lambda b, h, t: (b, 0, h, t, 0))
    per_head = [jax.ShapeDtypeStruct((batch, 1, kv_heads, width, slots), F32)] * n
    outs = pallas_call(
        kernel, grid=(batch, kv_heads, width // tile),
        in_specs=[spec] * n + [pl.BlockSpec((None, num_chunks, None, 1, slots),
                                            lambda b, h, t: (b, 0, h, 0, 0))] + [one] * n,
        out_specs=[spec] * n + [one] * n,
        out_shape=[jax.ShapeDtypeStruct(d.shape, F32) for d in deltas] + per_head,
        input_output_aliases={i: i for i in range(n)}, compiler_params=triton_params(4, 3),
        interpret=st.interpret, name="nha_chunk_scan_reverse" if reverse else "nha_chunk_scan",
    )(*deltas, log_decay, *(x.astype(F32)[:, None] for x in initial))
    return outs[:n], [x[:, 0] for x in outs[n:]]


# --- forward --------------------------------------------------------------------------------


def _key_band(st: Static, start, rows: int, block: int, length: int, lowest_ref,
              unmasked_ref):
    """(lo, hi, interior) of the key blocks for the queries at key positions start ..
    start + rows − 1 (the key arrays are `length` long): [lo, hi) meets their windows;
    interior = (full_lo, full_hi), the blocks inside every row's window and document (no mask),
    or None when documents come without their spans (`SlotDocs`; every block masked)."""
    hi = jnp.minimum(lax.div(start + rows - 1, block) + 1, length // block)
    below_diagonal = lax.div(start + 1, block)  # blocks before it end at or before the first row
    if lowest_ref is not None:
        return (lax.div(jnp.min(lowest_ref[...]), block), hi,
                (ceil_div(jnp.max(unmasked_ref[...]), block), below_diagonal))
    lo = lax.div(jnp.maximum(start - st.window + 1, 0), block)
    if st.documents:
        return lo, hi, None
    # Keys from the last row's window start to the first row: in every row's window.
    return lo, hi, (ceil_div(jnp.maximum(start + rows - st.window, 0), block), below_diagonal)


def _query_band(st: Static, first, keys: int, block: int, length: int, highest_ref,
                unmasked_ref):
    """(lo, hi, interior) of the query blocks (`length // block` of them, query i at key
    position st.offset + i) whose windows meet the keys at positions first .. first + keys − 1;
    interior as in `_key_band`: the query blocks that see each of these keys."""
    if highest_ref is None:
        last_query = first + keys + st.window - 2 - st.offset
    else:
        last_query = jnp.max(highest_ref[...]) - st.offset
    lo = lax.div(jnp.maximum(first - st.offset, 0), block)
    hi = jnp.where(last_query >= 0,
                   jnp.minimum(lax.div(jnp.maximum(last_query, 0), block) + 1, length // block), 0)
    if highest_ref is not None:
        until = jnp.min(unmasked_ref[...])
    elif st.documents:
        return lo, hi, None
    else:
        until = first + st.window - 1  # the last query whose window holds the first key
    after_keys = ceil_div(jnp.maximum(first + keys - 1 - st.offset, 0), block)
    return lo, hi, (after_keys, lax.div(jnp.maximum(until - st.offset + 1, 0), block))


def _visit_band(band, visit, carry):
    """`visit(i, carry, mask)` over the band (lo, hi, interior): mask None inside the interior,
    "full" elsewhere (`band_loop`)."""
    lo, hi, interior = band
    if interior is None:
        return lax.fori_loop(lo, hi, functools.partial(visit, mask="full"), carry)
    return band_loop(lo, hi, *interior, visit, carry)


def _in_window(st: Static, positions, cols, query_ids, key_ids):
    """`[R, BK]`: key positions `cols` in the windows of query `positions` (both positions of
    the key arrays), within the query's document."""
    inside = window_mask(positions, cols, st.window)
    return inside if query_ids is None else inside & (query_ids[:, None] == key_ids[None, :])


def _window_attention_kernel(*refs, st: Static, length: int):
    qw_ref, kw_ref, v_ref = refs[:3]
    optional = list(refs[3:-2])  # [a] [holds] then [query ids, key ids [, spans]] (_doc_inputs)
    a_ref = optional.pop(0) if st.slots else None
    holds_ref = optional.pop(0) if st.slots and st.documents else None
    qid_ref, kid_ref = optional[:2] if st.documents else (None, None)
    span_refs = optional[2:4] if st.document_bounds else (None, None)
    o_ref, lse_ref = refs[-2:]
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    start = pl.program_id(2) * BQ
    rows = start + iota((BQ, 1), 0)
    if st.slots:  # the slots open the online softmax; their values are added by slot_readout
        use = in_softmax(st, slot_rows(st, rows, None if holds_ref is None else holds_ref[...]))
        logits = jnp.where(use, LOG2E * a_ref[...], MASK_VALUE)
        m = jnp.max(logits, axis=1)
        l = jnp.sum(jnp.where(use, jnp.exp2(logits - m[:, None]), 0.0), axis=1)
    else:
        m = jnp.full((BQ,), MASK_VALUE, F32)
        l = jnp.zeros((BQ,), F32)
    acc = jnp.zeros(o_ref.shape, F32)
    if st.window:
        qw = qw_ref[...]
        positions = st.offset + rows
        query_ids = None if qid_ref is None else qid_ref[...]

        def visit(kb, carry, mask):
            m, l, acc = carry
            span = pl.ds(kb * BK, BK)
            logits = st.scale2 * mm_nt(qw, kw_ref[span, :])
            if mask:
                inside = _in_window(st, positions, kb * BK + iota((1, BK), 1), query_ids,
                                    None if kid_ref is None else kid_ref[span])
                logits = jnp.where(inside, logits, MASK_VALUE)
            m_new = jnp.maximum(m, jnp.max(logits, axis=1))
            p = jnp.exp2(logits - m_new[:, None])
            if mask:  # a row that has seen no key yet has m_new = MASK_VALUE: p = 1 here
                p = jnp.where(inside, p, 0.0)
            correction = jnp.exp2(m - m_new)
            acc = acc * correction[:, None] + mm(p.astype(qw.dtype), v_ref[span, :])
            return m_new, l * correction + jnp.sum(p, axis=1), acc

        band = _key_band(st, st.offset + start, BQ, BK, length, *span_refs)
        m, l, acc = _visit_band(band, visit, (m, l, acc))
    o_ref[...] = acc / l[:, None]
    lse_ref[...] = (m + jnp.log2(l)) / LOG2E


def _doc_inputs(docs: SlotDocs | None, st: Static, rows: int, key_length: int, *, holds: bool,
                keys: str):
    """(in_specs, arrays) of the document arrays of a window kernel with grid
    (b, ·, query block): the block's holds (if `holds`) and query ids, and the key ids — the
    whole row (keys="whole") or, for the dk/dv kernel whose grid walks key blocks, its block
    (keys="block"; the query ids are then the whole row); then, with `document_bounds`, the
    block's spans: `lowest_key` and `unmasked_from` (its rows are queries) or `highest_query`
    and `unmasked_until` (keys="block": its rows are keys)."""
    if docs is None:
        return [], []
    offset_blocks = st.offset // rows
    block = lambda n, shift: pl.BlockSpec((None, n), lambda b, h, i: (b, i + shift))
    whole = pl.BlockSpec((None, key_length), lambda b, h, i: (b, 0))
    bounds = 2 * st.document_bounds
    if keys == "block":
        return ([block(rows, 0), whole] + [block(rows, 0)] * bounds,
                [docs.ids, docs.ids] + [docs.highest_query, docs.unmasked_until][:bounds])
    specs, arrays = ([block(rows, 0)], [docs.holds]) if holds else ([], [])
    return (specs + [block(rows, offset_blocks), whole] + [block(rows, offset_blocks)] * bounds,
            arrays + [docs.ids, docs.ids] + [docs.lowest_key, docs.unmasked_from][:bounds])


def window_attention(qw, kw, v, slot_logits_, docs: SlotDocs | None, st: Static):
    """The window part of o (normalised by the softmax over slots AND window) `[B, Tp, H, V]`
    float32, and the log-sum-exp over both `[B, H, Tp]` float32. kw, v: `[B, P + Tp, G, ·]`
    (P = st.offset positions before the call); slot_logits_: `[B, Tp, H, M]` or None without
    slots."""
    batch, length, heads, window_dim = qw.shape
    key_length = kw.shape[1]
    value_dim, group = v.shape[-1], st.group
    BQ = st.blocks.block_q
    query = lambda d: pl.BlockSpec((None, BQ, None, d), lambda b, h, i: (b, i, h, 0))
    whole = lambda d: pl.BlockSpec((None, key_length, None, d),
                                   lambda b, h, i: (b, 0, h // group, 0))
    in_specs = [query(window_dim), whole(window_dim), whole(value_dim)]
    if st.slots:
        in_specs.append(query(slot_logits_.shape[-1]))
    doc_specs, doc_arrays = _doc_inputs(docs, st, BQ, key_length, holds=st.slots, keys="whole")
    return pallas_call(
        functools.partial(_window_attention_kernel, st=st, length=key_length),
        grid=(batch, heads, length // BQ),
        in_specs=in_specs + doc_specs,
        out_specs=[query(value_dim), pl.BlockSpec((None, None, BQ), lambda b, h, i: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct((batch, length, heads, value_dim), F32),
                   jax.ShapeDtypeStruct((batch, heads, length), F32)],
        compiler_params=_forward_params(st), interpret=st.interpret, name="nha_window_attention",
    )(qw, kw, v, *(() if slot_logits_ is None else (slot_logits_,)), *doc_arrays)


def _window_backward_queries_kernel(qw_ref, kw_ref, v_ref, do_ref, lse_ref, delta_ref, *refs,
                                    st: Static, length: int):
    qid_ref, kid_ref = refs[:2] if st.documents else (None, None)
    span_refs = refs[2:4] if st.document_bounds else (None, None)
    dqw_ref = refs[-1]
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    start = pl.program_id(2) * BQ
    positions = st.offset + start + iota((BQ, 1), 0)
    qw, do, lse, delta = qw_ref[...], do_ref[...], LOG2E * lse_ref[...], delta_ref[...]
    query_ids = None if qid_ref is None else qid_ref[...]

    def visit(kb, dqw, mask):
        span = pl.ds(kb * BK, BK)
        keys = kw_ref[span, :]
        p = jnp.exp2(st.scale2 * mm_nt(qw, keys) - lse[:, None])
        if mask:
            p = jnp.where(_in_window(st, positions, kb * BK + iota((1, BK), 1), query_ids,
                                     None if kid_ref is None else kid_ref[span]), p, 0.0)
        ds = p * (mm_nt(do, v_ref[span, :]) - delta[:, None])
        return dqw + mm(ds.astype(keys.dtype), keys)

    band = _key_band(st, st.offset + start, BQ, BK, length, *span_refs)
    dqw = _visit_band(band, visit, jnp.zeros(dqw_ref.shape, F32))
    dqw_ref[...] = (st.scale * dqw).astype(dqw_ref.dtype)


def window_backward_queries(qw, kw, v, do, lse, delta, docs: SlotDocs | None, st: Static):
    """Gradient of the window queries `[B, Tp, H, D]` (kw, v: `[B, P + Tp, G, ·]`)."""
    batch, length, heads, window_dim = qw.shape
    key_length = kw.shape[1]
    value_dim, group = v.shape[-1], st.group
    BQ = st.blocks.block_q
    query = lambda d: pl.BlockSpec((None, BQ, None, d), lambda b, h, i: (b, i, h, 0))
    whole = lambda d: pl.BlockSpec((None, key_length, None, d),
                                   lambda b, h, i: (b, 0, h // group, 0))
    row = pl.BlockSpec((None, None, BQ), lambda b, h, i: (b, h, i))
    doc_specs, doc_arrays = _doc_inputs(docs, st, BQ, key_length, holds=False, keys="whole")
    return pallas_call(
        functools.partial(_window_backward_queries_kernel, st=st, length=key_length),
        grid=(batch, heads, length // BQ),
        in_specs=[query(window_dim), whole(window_dim), whole(value_dim), query(value_dim), row,
                  row] + doc_specs,
        out_specs=query(window_dim), out_shape=jax.ShapeDtypeStruct(qw.shape, qw.dtype),
        compiler_params=_backward_params(st), interpret=st.interpret,
        name="nha_window_backward_queries",
    )(qw, kw, v, do, lse, delta, *doc_arrays)


def _backward_keys_kernel(qw_ref, kw_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, st: Static,
                          length: int):
    kid_ref, qid_ref = refs[:2] if st.documents else (None, None)
    span_refs = refs[2:4] if st.document_bounds else (None, None)
    dkw_ref, dv_ref = refs[-2:]
    BK, BQ = st.blocks.block_k_dkv, st.blocks.block_q_dkv
    first = pl.program_id(2) * BK  # a position of the key arrays; queries sit st.offset later
    cols = first + iota((1, BK), 1)
    key_rows = first + iota((BK, 1), 0)
    keys, values = kw_ref[...], v_ref[...]
    key_ids = None if kid_ref is None else kid_ref[...]
    dtype = keys.dtype
    dk = jnp.zeros(dkw_ref.shape, F32)
    dv = jnp.zeros(dv_ref.shape, F32)
    # The scores query-major `[BQ, BK]`, or key-major `[BK, BQ]` (`window_keys_transposed`:
    # every product then has the keys as its rows and takes the score tiles as they are made,
    # no transposes): `scores(a_q, b_k)` the product of a query-side and a key-side tile,
    # `to_keys` the products back to the keys' rows, `along` a query vector across the tile.
    if st.blocks.window_keys_transposed:
        scores, to_keys, along = (lambda a, b: mm_nt(b, a)), mm, (lambda x: x[None, :])
    else:
        scores, to_keys, along = mm_nt, mm_tn, (lambda x: x[:, None])

    def inside(qb):
        start = st.offset + qb * BQ
        query_ids = None if qid_ref is None else qid_ref[pl.ds(start, BQ)]
        if not st.blocks.window_keys_transposed:
            return _in_window(st, start + iota((BQ, 1), 0), cols, query_ids, key_ids)
        mask = window_mask(start + iota((1, BQ), 1), key_rows, st.window)
        return mask if key_ids is None else mask & (key_ids[:, None] == query_ids[None, :])

    band = _query_band(st, first, BK, BQ, length, *span_refs)
    for r in range(st.group):
        def visit(qb, carry, mask, r=r):
            dk, dv = carry
            span = pl.ds(qb * BQ, BQ)
            qw, do = qw_ref[span, r, :], do_ref[span, r, :]
            lse, delta = LOG2E * lse_ref[r, span], delta_ref[r, span]
            p = jnp.exp2(st.scale2 * scores(qw, keys) - along(lse))
            if mask:
                p = jnp.where(inside(qb), p, 0.0)
            dv = dv + to_keys(p.astype(dtype), do)
            ds = p * (scores(do, values) - along(delta))
            return dk + to_keys(ds.astype(dtype), qw), dv

        dk, dv = _visit_band(band, visit, (dk, dv))
    dkw_ref[...] = (st.scale * dk).astype(dkw_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def backward_window_keys(qw, kw, v, do, lse, delta, docs: SlotDocs | None, st: Static):
    """Gradients of the window keys and of the values through the window: `[B, P + Tp, G, ·]`
    (the P positions before the call included)."""
    batch, length, heads, window_dim = qw.shape
    key_length, kv_heads = kw.shape[1], kw.shape[2]
    value_dim, group = v.shape[-1], st.group
    BK = st.blocks.block_k_dkv
    whole = lambda d: pl.BlockSpec((None, length, None, group, d),
                                   lambda b, h, j: (b, 0, h, 0, 0))
    rows = pl.BlockSpec((None, None, group, length), lambda b, h, j: (b, h, 0, 0))
    block = lambda d: pl.BlockSpec((None, BK, None, d), lambda b, h, j: (b, j, h, 0))
    per_group = lambda x: x.reshape(batch, kv_heads, group, length)
    doc_specs, doc_arrays = _doc_inputs(docs, st, BK, key_length, holds=False, keys="block")
    return pallas_call(
        functools.partial(_backward_keys_kernel, st=st, length=length),
        grid=(batch, kv_heads, key_length // BK),
        in_specs=[whole(window_dim), block(window_dim), block(value_dim), whole(value_dim),
                  rows, rows] + doc_specs,
        out_specs=[block(window_dim), block(value_dim)],
        out_shape=[jax.ShapeDtypeStruct(kw.shape, kw.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=_backward_params(st), interpret=st.interpret,
        name="nha_backward_window_keys",
    )(LAYOUT.grouped(qw, group), kw, v, LAYOUT.grouped(do, group), per_group(lse),
      per_group(delta), *doc_arrays)
