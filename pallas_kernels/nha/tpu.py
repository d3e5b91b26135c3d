"""NHA kernels for TPUs: Pallas with the Mosaic TPU lowering. Tested in TPU interpret mode and
compiled for TPUs on the CPU (NOTES.md, "TPU lowering"); never run on a TPU.

Layout `[batch, heads, time, dim]` (api.py transposes), so every block's last two axes are
(time rows, features): 128-row tiles on the sublane axis and the full head dim (64, 128, 256)
or slot count on the lane axis; per-row and per-token arrays are `[..., 1, T]` with `(1, rows)`
blocks (`Layout.row_vectors`, `token_vectors`). The per-chunk slot kernels are the shared ones
(`slot_kernels`, with cumulative sums as triangular float32 matmuls: Mosaic has no cumsum). The
window kernels put the band on the grid, as in JAX's TPU flash attention: the last grid axis
steps through the key blocks that intersect a query block's windows (clamped indices; repeated
blocks skip their work), with the online-softmax state in VMEM scratch across those steps;
with documents they read the ids of the query and key blocks (`_WindowDocs`), and with an
initial state the key arrays hold its ring P = st.offset positions before the call (query t
is key position P + t).
The chunk scan walks the chunks along a sequential grid axis with the state in VMEM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.call import pallas_call
from pallas_kernels.matmul import mm, mm_nt, mm_tn
from pallas_kernels.nha import slot_kernels
from pallas_kernels.nha.chunk_math import F32, MASK_VALUE, iota, window_mask
from pallas_kernels.nha.layout import (
    Layout,
    Static,
    in_softmax,
    slot_rows,
    triangular_cumsum,
    triangular_reverse_cumsum,
)
from pallas_kernels.nha.slot_kernels import SlotDocs


def _params(num_axes: int, sequential_last: bool):
    semantics = ("parallel",) * (num_axes - 1) + (("arbitrary",) if sequential_last
                                                  else ("parallel",))
    return pltpu.CompilerParams(dimension_semantics=semantics)


def _interpret(st: Static):
    return pltpu.InterpretParams() if st.interpret else False


LAYOUT = Layout(
    head_major=True,
    params=lambda st, warps, num_axes, sequential_last, stages: _params(
        num_axes, sequential_last),
    interpret=_interpret,
    cumsum=triangular_cumsum,
    reverse_cumsum=triangular_reverse_cumsum,
    split_paths=False,
)

chunk_prepare = functools.partial(slot_kernels.chunk_prepare, layout=LAYOUT)
chunk_deltas_reverse = functools.partial(slot_kernels.chunk_deltas_reverse, layout=LAYOUT)
slot_logits = functools.partial(slot_kernels.slot_logits, layout=LAYOUT)
slot_readout_add = functools.partial(slot_kernels.slot_readout_add, layout=LAYOUT)
slot_readout = functools.partial(slot_kernels.slot_readout, layout=LAYOUT)
slot_backward_queries = functools.partial(slot_kernels.slot_backward_queries, layout=LAYOUT)
backward_slot_inputs = functools.partial(slot_kernels.backward_slot_inputs, layout=LAYOUT)


def chunk_scan(deltas, log_decay, st: Static, *, reverse: bool, initial=None):
    """Slot states at chunk boundaries and the finals (same contract as `gpu.chunk_scan`), one
    kernel per delta."""
    if initial is None:
        initial = [jnp.zeros(d.shape[:1] + d.shape[2:], F32) for d in deltas]
    outs = [_chunk_scan(delta, log_decay, init, st, reverse)
            for delta, init in zip(deltas, initial, strict=True)]
    return tuple(o[0] for o in outs), tuple(o[1] for o in outs)


def _chunk_scan(delta, log_decay, initial, st: Static, reverse: bool):
    """Grid (B, G, NC), the chunk axis sequential, the running state in VMEM."""
    batch, num_chunks, kv_heads, width, slots = delta.shape
    chunk = (lambda c: num_chunks - 1 - c) if reverse else (lambda c: c)
    spec = lambda d: pl.BlockSpec((None, None, None, d, slots),
                                  lambda b, h, c: (b, chunk(c), h, 0, 0))
    whole = pl.BlockSpec((None, None, width, slots), lambda b, h, c: (b, h, 0, 0))

    def kernel(delta_ref, decay_ref, init_ref, out_ref, final_ref, state_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            state_ref[...] = init_ref[...]

        update = delta_ref[...]
        out_ref[...] = state_ref[...]
        state_ref[...] = state_ref[...] * jnp.exp(decay_ref[...]) + update

        @pl.when(pl.program_id(2) == num_chunks - 1)
        def _():
            final_ref[...] = state_ref[...]

    return pallas_call(
        kernel, grid=(batch, kv_heads, num_chunks), in_specs=[spec(width), spec(1), whole],
        out_specs=[spec(width), whole],
        out_shape=[jax.ShapeDtypeStruct(delta.shape, F32),
                   jax.ShapeDtypeStruct((batch, kv_heads, width, slots), F32)],
        scratch_shapes=[pltpu.VMEM((width, slots), F32)], input_output_aliases={0: 0},
        compiler_params=_params(3, True), interpret=_interpret(st),
        name="nha_chunk_scan_reverse" if reverse else "nha_chunk_scan",
    )(delta, log_decay, initial.astype(F32))


# --- window kernels: the band on the grid ---------------------------------------------------


class _Band:
    """Key blocks of query block i at band step j: kb = lo(i) + j while kb ≤ hi(i); beyond,
    the index is clamped (the block is fetched again and the step does nothing). Query row t
    is key position P + t (P = st.offset positions before the call)."""

    def __init__(self, st: Static, rows: int, block: int, key_length: int):
        self.window, self.rows, self.block, self.offset = st.window, rows, block, st.offset
        self.steps = (rows + st.window - 2) // block + 2 if st.window else 1
        self.last = key_length // block - 1

    def bounds(self, i):
        start = self.offset + i * self.rows
        lo = lax.div(jnp.maximum(start - self.window + 1, 0), self.block)
        hi = jnp.minimum(lax.div(start + self.rows - 1, self.block), self.last)
        return lo, hi

    def key_block(self, i, j):
        lo, hi = self.bounds(i)
        return jnp.minimum(lo + j, hi)

    def active(self, i, j):
        lo, hi = self.bounds(i)
        return (lo + j <= hi) & (self.window > 0)


def _query_band(st: Static, key_length: int):
    """The grid of the forward and dq kernels, (b, h, query block i, band step j): the `_Band`
    and the block-spec makers of a query-block operand and of a key-block operand of width d
    (key blocks of kv head h // group, walking the band)."""
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    band = _Band(st, BQ, BK, key_length)
    query = lambda d: pl.BlockSpec((None, None, BQ, d), lambda b, h, i, j: (b, h, i, 0))
    keys = lambda d: pl.BlockSpec((None, None, BK, d),
                                  lambda b, h, i, j: (b, h // st.group, band.key_block(i, j), 0))
    return band, query, keys


class _WindowDocs:
    """The document arrays a window kernel reads (none without documents), as per-token
    `[B, 1, ·]` views (`Layout.token_vectors`): the ids `[B, P + Tp]` at the query block (its
    rows are key positions P + t) and at the key block, and the holds `[B, Tp]` at the query
    block (forward only)."""

    def __init__(self, docs: SlotDocs | None, st: Static, holds: bool):
        if st.documents != (docs is not None):
            raise ValueError(f"Static.documents is {st.documents} but documents given: "
                             f"{docs is not None}")
        self.docs, self.st, self.holds = docs, st, holds and docs is not None

    def specs(self, query_rows: int, key_rows: int, query_block, key_block):
        """(in_specs, arrays); query_block / key_block map the grid to (b, block index)."""
        if self.docs is None:
            return [], []
        at = lambda rows, index, shift=0: LAYOUT.tokens_spec(
            rows, lambda *grid: (lambda b, n: (b, n + shift))(*index(*grid)))
        ids = LAYOUT.token_vectors(self.docs.ids)
        specs = [at(query_rows, query_block, self.st.offset // query_rows),
                 at(key_rows, key_block)]
        if not self.holds:
            return specs, [ids, ids]
        return specs + [at(query_rows, query_block)], [ids, ids,
                                                       LAYOUT.token_vectors(self.docs.holds)]

    def refs(self, refs):
        """(query ids, key ids, holds) refs of the kernel's document refs (None where absent)."""
        refs = list(refs)
        return tuple(refs + [None] * (3 - len(refs)))

    def mask(self, inside: jax.Array, qid_ref, kid_ref) -> jax.Array:
        """`inside` `[R, K]` within each query's document."""
        if qid_ref is None:
            return inside
        rows, cols = inside.shape
        query_ids = LAYOUT.token_rows(qid_ref, 0, rows)[:, None]
        return inside & (query_ids == LAYOUT.token_rows(kid_ref, 0, cols)[None, :])


def window_attention(qw, kw, v, slot_logits_, docs: SlotDocs | None, st: Static):
    """The window part of o (normalised over slots and window) `[B, H, Tp, V]` and the
    log-sum-exp (`Layout.row_vectors` form), float32 (same contract as
    `gpu.window_attention`). kw, v: `[B, G, P + Tp, ·]`."""
    batch, heads, length, window_dim = qw.shape
    key_length, value_dim = kw.shape[2], v.shape[-1]
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    band, query, keys = _query_band(st, key_length)
    in_specs = [query(window_dim), keys(window_dim), keys(value_dim)]
    if st.slots:
        in_specs.append(query(slot_logits_.shape[-1]))
    window_docs = _WindowDocs(docs, st, holds=st.slots)
    doc_specs, doc_arrays = window_docs.specs(
        BQ, BK, lambda b, h, i, j: (b, i), lambda b, h, i, j: (b, band.key_block(i, j)))
    inputs = len(in_specs)

    def kernel(*refs):
        qw_ref, kw_ref, v_ref = refs[:3]
        a_ref = refs[3] if st.slots else None
        qid_ref, kid_ref, holds_ref = window_docs.refs(refs[inputs:inputs + len(doc_specs)])
        o_ref, lse_ref, m_ref, l_ref, acc_ref = refs[inputs + len(doc_specs):]
        i, j = pl.program_id(2), pl.program_id(3)
        rows = i * BQ + iota((BQ, 1), 0)

        @pl.when(j == 0)
        def _():
            if st.slots:  # the slots open the online softmax (values: slot_readout_add)
                holds = None if holds_ref is None else LAYOUT.token_rows(holds_ref, 0, BQ)
                use = in_softmax(st, slot_rows(st, rows, holds))
                logits = jnp.where(use, a_ref[...], MASK_VALUE)
                m = jnp.max(logits, axis=1, keepdims=True)
                p = jnp.where(use, jnp.exp(logits - m), 0.0)
                m_ref[...] = m
                l_ref[...] = jnp.sum(p, axis=1, keepdims=True)
            else:
                m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, F32)
                l_ref[...] = jnp.zeros(l_ref.shape, F32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

        @pl.when(band.active(i, j))
        def _():
            kb = band.key_block(i, j)
            inside = window_docs.mask(
                window_mask(st.offset + rows, kb * BK + iota((1, BK), 1), st.window), qid_ref,
                kid_ref)
            logits = st.scale * mm_nt(qw_ref[...], kw_ref[...])
            m_prev = m_ref[...]
            m_new = jnp.maximum(m_prev, jnp.max(jnp.where(inside, logits, MASK_VALUE), axis=1,
                                                keepdims=True))
            p = jnp.where(inside, jnp.exp(logits - m_new), 0.0)
            correction = jnp.exp(m_prev - m_new)
            acc_ref[...] = acc_ref[...] * correction + mm(p.astype(v_ref.dtype), v_ref[...])
            l_ref[...] = l_ref[...] * correction + jnp.sum(p, axis=1, keepdims=True)
            m_ref[...] = m_new

        @pl.when(j == band.steps - 1)
        def _():
            o_ref[...] = acc_ref[...] / l_ref[...]
            LAYOUT.set_column(lse_ref, m_ref[...] + jnp.log(l_ref[...]))

    return pallas_call(
        kernel, grid=(batch, heads, length // BQ, band.steps), in_specs=in_specs + doc_specs,
        out_specs=[query(value_dim), LAYOUT.rows_spec(BQ, lambda b, h, i, j: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct((batch, heads, length, value_dim), F32),
                   jax.ShapeDtypeStruct(LAYOUT.rows_shape(batch, heads, length), F32)],
        scratch_shapes=[pltpu.VMEM((BQ, 1), F32), pltpu.VMEM((BQ, 1), F32),
                        pltpu.VMEM((BQ, value_dim), F32)],
        compiler_params=_params(4, True), interpret=_interpret(st),
        name="nha_window_attention",
    )(qw, kw, v, *(() if slot_logits_ is None else (slot_logits_,)), *doc_arrays)


def window_backward_queries(qw, kw, v, do, lse, delta, docs: SlotDocs | None, st: Static):
    """Gradient of the window queries `[B, H, Tp, D]`."""
    batch, heads, length, window_dim = qw.shape
    key_length, value_dim = kw.shape[2], v.shape[-1]
    BQ, BK = st.blocks.block_q, st.blocks.block_k
    band, query, keys = _query_band(st, key_length)
    row = LAYOUT.rows_spec(BQ, lambda b, h, i, j: (b, h, i))
    window_docs = _WindowDocs(docs, st, holds=False)
    doc_specs, doc_arrays = window_docs.specs(
        BQ, BK, lambda b, h, i, j: (b, i), lambda b, h, i, j: (b, band.key_block(i, j)))

    def kernel(qw_ref, kw_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        qid_ref, kid_ref, _ = window_docs.refs(refs[:len(doc_specs)])
        dqw_ref, acc_ref = refs[len(doc_specs):]
        i, j = pl.program_id(2), pl.program_id(3)

        @pl.when(j == 0)
        def _():
            acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

        @pl.when(band.active(i, j))
        def _():
            rows = st.offset + i * BQ + iota((BQ, 1), 0)
            inside = window_docs.mask(
                window_mask(rows, band.key_block(i, j) * BK + iota((1, BK), 1), st.window),
                qid_ref, kid_ref)
            keys_ = kw_ref[...]
            p = jnp.where(inside, jnp.exp(st.scale * mm_nt(qw_ref[...], keys_)
                                          - LAYOUT.column(lse_ref)), 0.0)
            ds = p * (mm_nt(do_ref[...], v_ref[...]) - LAYOUT.column(delta_ref))
            acc_ref[...] += mm(ds.astype(keys_.dtype), keys_)

        @pl.when(j == band.steps - 1)
        def _():
            dqw_ref[...] = (st.scale * acc_ref[...]).astype(dqw_ref.dtype)

    return pallas_call(
        kernel, grid=(batch, heads, length // BQ, band.steps),
        in_specs=[query(window_dim), keys(window_dim), keys(value_dim), query(value_dim), row,
                  row] + doc_specs,
        out_specs=query(window_dim), out_shape=jax.ShapeDtypeStruct(qw.shape, qw.dtype),
        scratch_shapes=[pltpu.VMEM((BQ, window_dim), F32)],
        compiler_params=_params(4, True), interpret=_interpret(st),
        name="nha_window_backward_queries",
    )(qw, kw, v, do, lse, delta, *doc_arrays)


def backward_window_keys(qw, kw, v, do, lse, delta, docs: SlotDocs | None, st: Static):
    """Gradients of the window keys and of the values through the window `[B, G, P + Tp, ·]`:
    grid (B, G, key block, group·band steps)."""
    batch, kv_heads, key_length, window_dim = kw.shape
    length, value_dim, group = qw.shape[2], v.shape[-1], st.group
    BK, BQ = st.blocks.block_k_dkv, st.blocks.block_q_dkv
    steps = (BK + st.window - 2) // BQ + 2
    last = length // BQ - 1

    def query_block(kb, j):
        """Query block at step j of key block kb (query t sits at key position P + t), and
        whether the step has work."""
        qb = lax.div(jnp.maximum(kb * BK - st.offset, 0), BQ) + lax.rem(j, steps)
        hi = jnp.minimum(lax.div(jnp.maximum(kb * BK + BK + st.window - 2 - st.offset, 0), BQ),
                         last)
        return jnp.minimum(qb, hi), qb <= hi

    head = lambda h, j: h * group + lax.div(j, steps)
    query = lambda d: pl.BlockSpec(
        (None, None, BQ, d), lambda b, h, kb, j: (b, head(h, j), query_block(kb, j)[0], 0))
    row = LAYOUT.rows_spec(BQ, lambda b, h, kb, j: (b, head(h, j), query_block(kb, j)[0]))
    key = lambda d: pl.BlockSpec((None, None, BK, d), lambda b, h, kb, j: (b, h, kb, 0))
    window_docs = _WindowDocs(docs, st, holds=False)
    doc_specs, doc_arrays = window_docs.specs(
        BQ, BK, lambda b, h, kb, j: (b, query_block(kb, j)[0]), lambda b, h, kb, j: (b, kb))

    def kernel(qw_ref, kw_ref, v_ref, do_ref, lse_ref, delta_ref, *refs):
        qid_ref, kid_ref, _ = window_docs.refs(refs[:len(doc_specs)])
        dkw_ref, dv_ref, dk_acc, dv_acc = refs[len(doc_specs):]
        kb, j = pl.program_id(2), pl.program_id(3)

        @pl.when(j == 0)
        def _():
            dk_acc[...] = jnp.zeros(dk_acc.shape, F32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, F32)

        qb, active = query_block(kb, j)

        @pl.when(active)
        def _():
            keys_, values, qw, do = kw_ref[...], v_ref[...], qw_ref[...], do_ref[...]
            inside = window_docs.mask(
                window_mask(st.offset + qb * BQ + iota((BQ, 1), 0), kb * BK + iota((1, BK), 1),
                            st.window), qid_ref, kid_ref)
            p = jnp.where(inside, jnp.exp(st.scale * mm_nt(qw, keys_) - LAYOUT.column(lse_ref)),
                          0.0)
            dv_acc[...] += mm_tn(p.astype(values.dtype), do)
            ds = p * (mm_nt(do, values) - LAYOUT.column(delta_ref))
            dk_acc[...] += st.scale * mm_tn(ds.astype(keys_.dtype), qw)

        @pl.when(j == group * steps - 1)
        def _():
            dkw_ref[...] = dk_acc[...].astype(dkw_ref.dtype)
            dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

    return pallas_call(
        kernel, grid=(batch, kv_heads, key_length // BK, group * steps),
        in_specs=[query(window_dim), key(window_dim), key(value_dim), query(value_dim), row,
                  row] + doc_specs,
        out_specs=[key(window_dim), key(value_dim)],
        out_shape=[jax.ShapeDtypeStruct(kw.shape, kw.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((BK, window_dim), F32), pltpu.VMEM((BK, value_dim), F32)],
        compiler_params=_params(4, True), interpret=_interpret(st),
        name="nha_backward_window_keys",
    )(qw, kw, v, do, lse, delta, *doc_arrays)
