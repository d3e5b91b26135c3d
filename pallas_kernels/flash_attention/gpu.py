"""Flash-attention kernels for NVIDIA GPUs: Pallas with the Triton lowering (BlockSpec kernels,
testable in interpret mode on CPU; see NOTES.md for the choice over Mosaic GPU).

Layout `[batch, time, heads, dim]`, time padded to a multiple of the tiles, causal. Per query
block the forward visits key blocks from the lowest visible key of its rows (`bounds.py`: the
window and the documents) up to the diagonal, with an online softmax in float32; it saves the
log-sum-exp. The backward recomputes the probabilities: dq per query block over the same key
blocks, dk/dv per key block over the query blocks from the diagonal to the last query that
sees one of its keys, looping over the query heads of its GQA group. Blocks that every row
surely sees in full (inside one document run, the window and the causal triangle) skip the
mask: each loop runs in three parts, masked / unmasked / masked.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.flash_attention.block_sizes import BlockSizes
from pallas_kernels.flash_attention.reference import visible
from pallas_kernels.matmul import mm, mm_nt, mm_tn

F32 = jnp.float32
MASK_VALUE = -1e30  # finite: running maxima never meet inf − inf


@dataclasses.dataclass(frozen=True)
class Static:
    """The static configuration of one call."""

    window: int | None
    scale: float
    group: int  # query heads per kv head
    blocks: BlockSizes
    interpret: bool


def _iota(shape, axis):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def _params(num_warps, num_stages):
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _mask(st: Static, rows, cols, row_segments, col_segments):
    return visible(rows, cols, row_segments, col_segments, st.window)


def _loop(lo, hi, full_lo, full_hi, visit, carry):
    """`visit(i, carry, masked)` over [lo, hi); unmasked for i in [full_lo, full_hi)."""
    a = jnp.clip(full_lo, lo, hi)
    b = jnp.clip(full_hi, a, hi)
    carry = lax.fori_loop(lo, a, functools.partial(visit, masked=True), carry)
    carry = lax.fori_loop(a, b, functools.partial(visit, masked=False), carry)
    return lax.fori_loop(b, hi, functools.partial(visit, masked=True), carry)


def _key_blocks(st: Static, start, lowest_ref, unmasked_ref):
    """lo, hi, full_lo, full_hi of the key blocks of the query block starting at `start`."""
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    lo = lax.div(jnp.min(lowest_ref[...]), BK)
    hi = lax.div(start + BQ - 1, BK) + 1
    full_lo = lax.div(jnp.max(unmasked_ref[...]) + BK - 1, BK)
    return lo, hi, full_lo, lax.div(start + 1, BK)


# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(q_ref, k_ref, v_ref, qseg_ref, kseg_ref, lowest_ref, unmasked_ref, o_ref,
                    lse_ref, *, st: Static):
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    start = pl.program_id(2) * BQ
    rows = start + _iota((BQ, 1), 0)
    q, qseg = q_ref[...], qseg_ref[...][:, None]

    def visit(kb, carry, masked):
        m, l, acc = carry
        span = pl.ds(kb * BK, BK)
        logits = st.scale * mm_nt(q, k_ref[span, :])
        if masked:
            inside = _mask(st, rows, kb * BK + _iota((1, BK), 1), qseg, kseg_ref[span][None, :])
            logits = jnp.where(inside, logits, MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        p = jnp.exp(logits - m_new[:, None])
        if masked:  # a row with no visible key yet has m_new = MASK_VALUE
            p = jnp.where(inside, p, 0.0)
        correction = jnp.exp(m - m_new)
        acc = acc * correction[:, None] + mm(p.astype(v_ref.dtype), v_ref[span, :])
        return m_new, l * correction + jnp.sum(p, axis=1), acc

    init = (jnp.full((BQ,), MASK_VALUE, F32), jnp.zeros((BQ,), F32),
            jnp.zeros(o_ref.shape, F32))
    m, l, acc = _loop(*_key_blocks(st, start, lowest_ref, unmasked_ref), visit, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)  # every row sees itself: l > 0
    lse_ref[...] = m + jnp.log(l)


def _query_specs(st: Static, length: int, head_dim: int):
    BQ, group = st.blocks.block_q, st.group
    query = pl.BlockSpec((None, BQ, None, head_dim), lambda b, h, i: (b, i, h, 0))
    whole = pl.BlockSpec((None, length, None, head_dim), lambda b, h, i: (b, 0, h // group, 0))
    rows = pl.BlockSpec((None, BQ), lambda b, h, i: (b, i))
    return query, whole, rows, pl.BlockSpec((None, length), lambda b, h, i: (b, 0))


def forward(q, k, v, segment_ids, spans, st: Static):
    """o `[B, Tp, H, D]` (dtype of q) and the log-sum-exp `[B, H, Tp]` float32."""
    batch, length, heads, head_dim = q.shape
    lowest_key, _, unmasked_from, _ = spans
    query, whole, rows, all_rows = _query_specs(st, length, head_dim)
    BQ = st.blocks.block_q
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(batch, heads, length // BQ),
        in_specs=[query, whole, whole, rows, all_rows, rows, rows],
        out_specs=[query, pl.BlockSpec((None, None, BQ), lambda b, h, i: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, length), F32)],
        compiler_params=_params(st.blocks.num_warps, st.blocks.num_stages),
        interpret=st.interpret, name="flash_attention_forward",
    )(q, k, v, segment_ids, segment_ids, lowest_key, unmasked_from)


# --- backward -------------------------------------------------------------------------------


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref, lowest_ref,
               unmasked_ref, dq_ref, *, st: Static):
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    start = pl.program_id(2) * BQ
    rows = start + _iota((BQ, 1), 0)
    q, do, qseg = q_ref[...], do_ref[...], qseg_ref[...][:, None]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]

    def visit(kb, dq, masked):
        span = pl.ds(kb * BK, BK)
        keys = k_ref[span, :]
        p = jnp.exp(st.scale * mm_nt(q, keys) - lse)
        if masked:
            inside = _mask(st, rows, kb * BK + _iota((1, BK), 1), qseg, kseg_ref[span][None, :])
            p = jnp.where(inside, p, 0.0)
        ds = p * (mm_nt(do, v_ref[span, :]) - delta)
        return dq + mm(ds.astype(keys.dtype), keys)

    dq = _loop(*_key_blocks(st, start, lowest_ref, unmasked_ref), visit,
               jnp.zeros(dq_ref.shape, F32))
    dq_ref[...] = (st.scale * dq).astype(dq_ref.dtype)


def _dq(q, k, v, do, lse, delta, segment_ids, spans, st: Static):
    batch, length, heads, head_dim = q.shape
    lowest_key, _, unmasked_from, _ = spans
    query, whole, rows, all_rows = _query_specs(st, length, head_dim)
    BQ = st.blocks.block_q
    stat = pl.BlockSpec((None, None, BQ), lambda b, h, i: (b, h, i))
    return pl.pallas_call(
        functools.partial(_dq_kernel, st=st),
        grid=(batch, heads, length // BQ),
        in_specs=[query, whole, whole, query, stat, stat, rows, all_rows, rows, rows],
        out_specs=query, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=_params(st.blocks.backward_num_warps, st.blocks.backward_num_stages),
        interpret=st.interpret, name="flash_attention_dq",
    )(q, k, v, do, lse, delta, segment_ids, segment_ids, lowest_key, unmasked_from)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref,
                highest_ref, unmasked_ref, dk_ref, dv_ref, *, st: Static, length: int):
    BK, BQ = st.blocks.block_k_dkv, st.blocks.block_q_dkv
    first = pl.program_id(2) * BK
    cols = first + _iota((1, BK), 1)
    keys, values, kseg = k_ref[...], v_ref[...], kseg_ref[...][None, :]
    bounds = (lax.div(first, BQ),
              jnp.minimum(lax.div(jnp.max(highest_ref[...]), BQ) + 1, length // BQ),
              lax.div(first + BK - 1 + BQ - 1, BQ),
              lax.div(jnp.min(unmasked_ref[...]) + 1, BQ))
    dk = jnp.zeros(dk_ref.shape, F32)
    dv = jnp.zeros(dv_ref.shape, F32)
    for r in range(st.group):
        def visit(qb, carry, masked, r=r):
            dk, dv = carry
            span = pl.ds(qb * BQ, BQ)
            q, do = q_ref[span, r, :], do_ref[span, r, :]
            lse, delta = lse_ref[r, span][:, None], delta_ref[r, span][:, None]
            p = jnp.exp(st.scale * mm_nt(q, keys) - lse)
            if masked:
                inside = _mask(st, qb * BQ + _iota((BQ, 1), 0), cols, qseg_ref[span][:, None],
                               kseg)
                p = jnp.where(inside, p, 0.0)
            dv = dv + mm_tn(p.astype(do.dtype), do)
            ds = p * (mm_nt(do, values) - delta)
            return dk + mm_tn(ds.astype(q.dtype), q), dv

        dk, dv = _loop(*bounds, visit, (dk, dv))
    dk_ref[...] = (st.scale * dk).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dkv(q, k, v, do, lse, delta, segment_ids, spans, st: Static):
    batch, length, kv_heads, head_dim = k.shape
    _, highest_query, _, unmasked_until = spans
    BK, group = st.blocks.block_k_dkv, st.group
    grouped = lambda x: x.reshape(batch, length, kv_heads, group, head_dim)
    per_group = lambda x: x.reshape(batch, kv_heads, group, length)
    whole = pl.BlockSpec((None, length, None, group, head_dim), lambda b, h, j: (b, 0, h, 0, 0))
    stat = pl.BlockSpec((None, None, group, length), lambda b, h, j: (b, h, 0, 0))
    block = pl.BlockSpec((None, BK, None, head_dim), lambda b, h, j: (b, j, h, 0))
    keys = pl.BlockSpec((None, BK), lambda b, h, j: (b, j))
    return pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, length=length),
        grid=(batch, kv_heads, length // BK),
        in_specs=[whole, block, block, whole, stat, stat,
                  pl.BlockSpec((None, length), lambda b, h, j: (b, 0)), keys, keys, keys],
        out_specs=[block, block],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=_params(st.blocks.backward_num_warps, st.blocks.backward_num_stages),
        interpret=st.interpret, name="flash_attention_dkv",
    )(grouped(q), k, v, grouped(do), per_group(lse), per_group(delta), segment_ids,
      segment_ids, highest_query, unmasked_until)


def backward(q, k, v, o, lse, do, segment_ids, spans, st: Static):
    """dq, dk, dv from the saved output and log-sum-exp (D = rowsum(o ⊙ dO) in float32)."""
    delta = jnp.einsum("bthd,bthd->bht", o.astype(F32), do.astype(F32))
    dq = _dq(q, k, v, do, lse, delta, segment_ids, spans, st)
    dk, dv = _dkv(q, k, v, do, lse, delta, segment_ids, spans, st)
    return dq, dk, dv
