"""Flash-attention kernels for NVIDIA GPUs: Pallas with the Triton lowering (BlockSpec kernels,
testable in interpret mode on CPU; see NOTES.md for the choice over Mosaic GPU).

Layout `[batch, time, heads, dim]`, time padded to a multiple of the tiles, causal. Logits are
kept in base 2: `s·scale·log₂e` (one FMA with the row maximum before `exp2`), and the saved
log-sum-exp is base 2 too.

- forward, per query block: key blocks from the lowest visible key of its rows (`bounds.py`:
  the window and the documents) up to the diagonal, online softmax in float32.
- dq, per query block over the same key blocks: p recomputed from the log-sum-exp,
  dS = p ⊙ (dO·Vᵀ − D), D = rowsum(O ⊙ dO) precomputed in XLA, dq = scale·dS·K.
- dk/dv, per key block over the query blocks from the diagonal to the last query that sees one
  of its keys, in the transposed orientation (Sᵀ = K·Qᵀ) so that no register tile is
  transposed: dv += Pᵀ·dO, dk += dSᵀ·Q. With `dq_atomic` this kernel also adds dSᵀᵀ·K into a
  float32 dq buffer (`[B, H, D, T]`, so the share Kᵀ·dSᵀ needs no transpose either) and the dq
  kernel is not run. A program takes the query heads of its GQA group in turn, or one query
  head (`dkv_per_query_head`).

With active query rows (`Static.active_queries`: Oryx's attention-mode tokens) the forward
writes 0 and a log-sum-exp of +inf on the others (every backward p of theirs is then 0), a
query block with no active row visits no key block in the forward and dq kernels (its rows'
lowest key is set past the end), and the dk/dv kernel skips such query blocks (`lax.cond`).

Blocks that every row surely sees in full (inside one document run, the window and the causal
triangle) skip the mask: each loop runs in three parts, masked / unmasked / masked. The grid's
first axis (the fastest in launch order) is the block index, so the programs that run at the
same time share one head's K/V (or Q/dO) in L2; query blocks go last-first (the longest rows
start first).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.band_loop import band_loop, ceil_div
from pallas_kernels.base2 import LOG2E
from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.flash_attention.block_sizes import BlockSizes
from pallas_kernels.flash_attention.reference import visible
from pallas_kernels.matmul import mm, mm_nt, mm_tn

F32 = jnp.float32
# Finite, so running maxima never meet inf − inf; a power of two, so its product with the
# float32 logit scale is exact and `s·scale2 − m` is exactly 0 on a row's masked keys while
# it has seen no visible one, also when the compiler fuses it into an FMA (with −1e30 the
# FMA kept the product's rounding error, ±1e22, and `forward_one_select` gave p = inf, then
# 0·inf = NaN at the row's first visible key).
MASK_VALUE = -(2.0**100)


@dataclasses.dataclass(frozen=True)
class Static:
    """The static configuration of one call."""

    window: int | None
    scale: float
    group: int  # query heads per kv head
    blocks: BlockSizes
    interpret: bool
    active_queries: bool = False  # `[B, Tp]` int32 query-row flags are passed (module docstring)

    @property
    def scale2(self) -> float:
        """The logit scale in base 2: exp(scale·s) = exp2(scale2·s)."""
        return self.scale * LOG2E

    def causal_part(self, side: str) -> str | None:
        """`band_loop`'s causal_part: `side` with blocks.diagonal_causal_only, else None."""
        return side if self.blocks.diagonal_causal_only else None


def _iota(shape, axis):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def _inside(rows, cols, row_segments, col_segments, window, mask):
    """The visibility of a masked block: the whole test, or the causal one alone."""
    if mask == "causal":
        return cols <= rows
    return visible(rows, cols, row_segments, col_segments, window)


def _last_first(blocks: int):
    """Block index of grid step i when the blocks go last-first."""
    return lambda i: blocks - 1 - i


def _query_block_start(block: int):
    return (pl.num_programs(0) - 1 - pl.program_id(0)) * block


def _key_blocks(start, block_q, block_k, lowest_ref, unmasked_ref):
    """lo, hi, full_lo, full_hi of the key blocks of the query block starting at `start`."""
    lo = lax.div(jnp.min(lowest_ref[...]), block_k)
    hi = lax.div(start + block_q - 1, block_k) + 1
    full_lo = ceil_div(jnp.max(unmasked_ref[...]), block_k)
    return lo, hi, full_lo, lax.div(start + 1, block_k)


def _query_specs(length: int, head_dim: int, block_q: int, group: int):
    """BlockSpecs of a grid (query block, head, batch): a query tile, a kv head's whole rows,
    per-row values of the tile, and the whole row of per-token values."""
    row = _last_first(length // block_q)
    query = pl.BlockSpec((None, block_q, None, head_dim), lambda i, h, b: (b, row(i), h, 0))
    whole = pl.BlockSpec((None, length, None, head_dim), lambda i, h, b: (b, 0, h // group, 0))
    rows = pl.BlockSpec((None, block_q), lambda i, h, b: (b, row(i)))
    stat = pl.BlockSpec((None, None, block_q), lambda i, h, b: (b, h, row(i)))
    return query, whole, rows, pl.BlockSpec((None, length), lambda i, h, b: (b, 0)), stat


# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(q_ref, k_ref, v_ref, qseg_ref, kseg_ref, lowest_ref, unmasked_ref, *refs,
                    st: Static):
    """refs: (the query rows' active flags with `st.active_queries`,) o, lse."""
    o_ref, lse_ref = refs[-2:]
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    start = _query_block_start(BQ)
    rows = start + _iota((BQ, 1), 0)
    q, qseg = q_ref[...], qseg_ref[...][:, None]

    def visit(kb, carry, mask):
        m, l, acc = carry
        span = pl.ds(kb * BK, BK)
        s = mm_nt(q, k_ref[span, :])
        if mask:
            inside = _inside(rows, kb * BK + _iota((1, BK), 1), qseg, kseg_ref[span][None, :],
                             st.window, mask)
            s = jnp.where(inside, s, MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, axis=1) * st.scale2)
        p = jnp.exp2(s * st.scale2 - m_new[:, None])
        if mask and not st.blocks.forward_one_select:
            # A row with no visible key yet has m_new = MASK_VALUE·scale2, so p = 1 on its
            # masked keys. With forward_one_select that is left: the row's first visible key
            # (every row sees itself) gives a correction exp2(m − m_new) = 0 to what came before.
            p = jnp.where(inside, p, 0.0)
        correction = jnp.exp2(m - m_new)
        acc = acc * correction[:, None] + mm(p.astype(v_ref.dtype), v_ref[span, :])
        return m_new, l * correction + jnp.sum(p, axis=1), acc

    init = (jnp.full((BQ,), MASK_VALUE, F32), jnp.zeros((BQ,), F32),
            jnp.zeros(o_ref.shape, F32))
    m, l, acc = band_loop(*_key_blocks(start, BQ, BK, lowest_ref, unmasked_ref), visit, init,
                      st.causal_part("last"))
    # Every row sees itself, so l > 0 on every row the loop ran for.
    out, lse = acc / l[:, None], m + jnp.log2(l)
    if st.active_queries:  # an inactive row (l may be 0 there) is 0, and no p of it counts
        active = refs[0][...] != 0
        out, lse = jnp.where(active[:, None], out, 0.0), jnp.where(active, lse, jnp.inf)
    o_ref[...] = out.astype(o_ref.dtype)
    lse_ref[...] = lse


def forward(q, k, v, segment_ids, active, spans, st: Static):
    """o `[B, Tp, H, D]` (dtype of q) and the base-2 log-sum-exp `[B, H, Tp]` float32; `active`
    the `[B, Tp]` int32 query flags with `st.active_queries`, else None."""
    batch, length, heads, head_dim = q.shape
    lowest_key, _, unmasked_from, _ = spans
    BQ = st.blocks.block_q
    query, whole, rows, all_rows, stat = _query_specs(length, head_dim, BQ, st.group)
    flags = [active] if st.active_queries else []
    return pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(length // BQ, heads, batch),
        in_specs=[query, whole, whole, rows, all_rows, rows, rows] + [rows] * len(flags),
        out_specs=[query, stat],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, length), F32)],
        compiler_params=triton_params(st.blocks.num_warps, st.blocks.num_stages),
        interpret=st.interpret, name="flash_attention_forward",
    )(q, k, v, segment_ids, segment_ids, lowest_key, unmasked_from, *flags)


# --- backward -------------------------------------------------------------------------------


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref, lowest_ref,
               unmasked_ref, dq_ref, *, st: Static):
    BQ, BK = st.blocks.block_q_dq, st.blocks.block_k_dq
    start = _query_block_start(BQ)
    rows = start + _iota((BQ, 1), 0)
    q, do, qseg = q_ref[...], do_ref[...], qseg_ref[...][:, None]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]

    def visit(kb, dq, mask):
        span = pl.ds(kb * BK, BK)
        keys = k_ref[span, :]
        p = jnp.exp2(mm_nt(q, keys) * st.scale2 - lse)
        if mask:
            inside = _inside(rows, kb * BK + _iota((1, BK), 1), qseg, kseg_ref[span][None, :],
                             st.window, mask)
            p = jnp.where(inside, p, 0.0)
        ds = p * (mm_nt(do, v_ref[span, :]) - delta)
        return dq + mm(ds.astype(keys.dtype), keys)

    dq = band_loop(*_key_blocks(start, BQ, BK, lowest_ref, unmasked_ref), visit,
               jnp.zeros(dq_ref.shape, F32), st.causal_part("last"))
    dq_ref[...] = (st.scale * dq).astype(dq_ref.dtype)


def _dq(q, k, v, do, lse, delta, segment_ids, spans, st: Static):
    batch, length, heads, head_dim = q.shape
    lowest_key, _, unmasked_from, _ = spans
    BQ = st.blocks.block_q_dq
    query, whole, rows, all_rows, stat = _query_specs(length, head_dim, BQ, st.group)
    return pallas_call(
        functools.partial(_dq_kernel, st=st),
        grid=(length // BQ, heads, batch),
        in_specs=[query, whole, whole, query, stat, stat, rows, all_rows, rows, rows],
        out_specs=query, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=triton_params(st.blocks.dq_num_warps, st.blocks.dq_num_stages),
        interpret=st.interpret, name="flash_attention_dq",
    )(q, k, v, do, lse, delta, segment_ids, segment_ids, lowest_key, unmasked_from)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref,
                highest_ref, unmasked_ref, *refs, st: Static, length: int, heads: int):
    """One key block against the query blocks that see it, for `heads` query heads (q_ref
    `[T, heads, D]`); refs: (the query rows' active flags `[T]` with `st.active_queries`,)
    then dk, dv (and the float32 dq buffer `[heads, D, T]` with dq_atomic, an alias of a zero
    input)."""
    BK, BQ = st.blocks.block_k_dkv, st.blocks.block_q_dkv
    if st.active_queries:
        active_ref, *refs = refs
    dk_ref, dv_ref = refs[-2:]  # with dq_atomic refs[0] is the zero input that refs[1] aliases
    first = pl.program_id(0) * BK
    cols = first + _iota((BK, 1), 0)  # this block's keys run down the rows of Sᵀ
    keys, values, kseg = k_ref[...], v_ref[...], kseg_ref[...][:, None]
    bounds = (lax.div(first, BQ),
              jnp.minimum(lax.div(jnp.max(highest_ref[...]), BQ) + 1, length // BQ),
              ceil_div(first + BK - 1, BQ),
              lax.div(jnp.min(unmasked_ref[...]) + 1, BQ))
    dk = jnp.zeros(dk_ref.shape, F32)
    dv = jnp.zeros(dv_ref.shape, F32)
    for r in range(heads):
        def visit(qb, carry, mask, r=r):
            if not st.active_queries:
                return pair(qb, carry, mask, r)
            # A block of inactive rows adds nothing (p = 0 there): skipped.
            return lax.cond(jnp.max(active_ref[pl.ds(qb * BQ, BQ)]) != 0,
                            lambda c: pair(qb, c, mask, r), lambda c: c, carry)

        def pair(qb, carry, mask, r):
            dk, dv = carry
            span = pl.ds(qb * BQ, BQ)
            q, do = q_ref[span, r, :], do_ref[span, r, :]
            lse, delta = lse_ref[r, span][None, :], delta_ref[r, span][None, :]
            p_t = jnp.exp2(mm_nt(keys, q) * st.scale2 - lse)  # [BK, BQ]
            if mask:
                inside = _inside(qb * BQ + _iota((1, BQ), 1), cols, qseg_ref[span][None, :],
                                 kseg, st.window, mask)
                p_t = jnp.where(inside, p_t, 0.0)
            dv = dv + mm(p_t.astype(do.dtype), do)
            ds_t = (p_t * (mm_nt(values, do) - delta)).astype(q.dtype)
            if st.blocks.dq_atomic:
                pltriton.atomic_add(refs[1], (jnp.asarray(r, jnp.int32), slice(None), span),
                                    mm_tn(keys, ds_t))
            return dk + mm(ds_t, q), dv

        dk, dv = band_loop(*bounds, visit, (dk, dv), st.causal_part("first"))
    dk_ref[...] = (st.scale * dk).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dkv(q, k, v, do, lse, delta, segment_ids, active, spans, st: Static):
    """dk, dv `[B, Tp, G, D]` (and with dq_atomic the float32 dq `[B, H, D, Tp]`, unscaled)."""
    batch, length, kv_heads, head_dim = k.shape
    _, highest_query, _, unmasked_until = spans
    BK, group, heads = st.blocks.block_k_dkv, st.group, q.shape[2]
    per_program = 1 if st.blocks.dkv_per_query_head else group
    programs = heads // per_program  # along the grid's head axis
    kv_head = lambda h: h * per_program // group
    grouped = lambda x: x.reshape(batch, length, programs, per_program, head_dim)
    per_group = lambda x: x.reshape(batch, programs, per_program, length)
    whole = pl.BlockSpec((None, length, None, per_program, head_dim),
                         lambda j, h, b: (b, 0, h, 0, 0))
    stat = pl.BlockSpec((None, None, per_program, length), lambda j, h, b: (b, h, 0, 0))
    block = pl.BlockSpec((None, BK, None, head_dim), lambda j, h, b: (b, j, kv_head(h), 0))
    out_block = pl.BlockSpec((None, BK, None, head_dim), lambda j, h, b: (b, j, h, 0))
    keys = pl.BlockSpec((None, BK), lambda j, h, b: (b, j))
    # Summed over the group afterwards: float32 partials per query head.
    out_dtype = k.dtype if per_program == group else F32
    out_shape = [jax.ShapeDtypeStruct((batch, length, programs, head_dim), out_dtype)] * 2
    all_rows = pl.BlockSpec((None, length), lambda j, h, b: (b, 0))
    in_specs = [whole, block, block, whole, stat, stat, all_rows, keys, keys, keys]
    args = [grouped(q), k, v, grouped(do), per_group(lse), per_group(delta), segment_ids,
            segment_ids, highest_query, unmasked_until]
    if st.active_queries:
        in_specs.append(all_rows)
        args.append(active)
    out_specs, aliases = [out_block, out_block], {}
    if st.blocks.dq_atomic:
        dq_spec = pl.BlockSpec((None, None, per_program, head_dim, length),
                               lambda j, h, b: (b, h, 0, 0, 0))
        dq_shape = (batch, programs, per_program, head_dim, length)
        in_specs.append(dq_spec)
        args.append(jnp.zeros(dq_shape, F32))
        out_specs.insert(0, dq_spec)
        out_shape.insert(0, jax.ShapeDtypeStruct(dq_shape, F32))
        aliases = {len(args) - 1: 0}
    outs = pallas_call(
        functools.partial(_dkv_kernel, st=st, length=length, heads=per_program),
        grid=(length // BK, programs, batch),
        in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=triton_params(st.blocks.dkv_num_warps, st.blocks.dkv_num_stages),
        interpret=st.interpret, name="flash_attention_dkv",
    )(*args)
    dk, dv = outs[-2:]
    if per_program != group:
        dk, dv = (x.reshape(batch, length, kv_heads, group // per_program, head_dim).sum(3)
                  .astype(k.dtype) for x in (dk, dv))
    if st.blocks.dq_atomic:
        return dk, dv, outs[0].reshape(batch, heads, head_dim, length)
    return dk, dv


def backward(q, k, v, o, lse, do, segment_ids, active, spans, st: Static):
    """dq, dk, dv from the saved output and log-sum-exp (D = rowsum(o ⊙ dO) in float32; 0 on
    inactive rows, whose output is 0)."""
    delta = jnp.einsum("bthd,bthd->bht", o.astype(F32), do.astype(F32))
    if st.blocks.dq_atomic:
        dk, dv, dq_t = _dkv(q, k, v, do, lse, delta, segment_ids, active, spans, st)
        dq = (st.scale * jnp.transpose(dq_t, (0, 3, 1, 2))).astype(q.dtype)
        return dq, dk, dv
    dq = _dq(q, k, v, do, lse, delta, segment_ids, spans, st)
    dk, dv = _dkv(q, k, v, do, lse, delta, segment_ids, active, spans, st)
    return dq, dk, dv
