"""The per-chunk slot kernels of NHA, written once for both backends (`layout.Layout`).

Each program owns one chunk of C steps of one head (or of one kv head's group of query heads)
and the slot state entering that chunk (`chunk_math` does the chunk's math):

  chunk_prepare         gate cumsum G, the chunk's writes to the slot states, its decay
  slot_logits           scale·K̃_tᵀ q_t for every step
  slot_readout_add      o += Ṽ_tᵀ P_t with the final softmax weights of the slots
  slot_backward_queries dq, dA = P ⊙ (dP − D), P, and the query part of the log-gate gradient
  chunk_deltas_reverse  the chunk's pull on the state gradients
  backward_slot_inputs  dk̄, dv̄, ds̄ and the log-gate gradient (reverse cumsum in the chunk)

Arrays are in the layout's order (`[B, T, H, d]` or `[B, H, T, d]`); slot states are
`[B, NC, G, X, M]` float32; per-row arrays (lse, D) `[B, H, T]`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.nha.chunk_math import (
    F32,
    iota,
    mm_tn,
    rows_of,
    slot_input_grads,
    slot_readout,
    slot_scores,
)
from pallas_kernels.nha.layout import (
    Layout,
    Static,
    chunk_valid,
    masked,
    slot_dtype,
    stream_chunk,
    visible,
)


def _dims(x: jax.Array, layout: Layout):
    """(batch, length, heads, features) of an array in the layout."""
    if layout.head_major:
        return x.shape[0], x.shape[2], x.shape[1], x.shape[3]
    return x.shape


class _Specs:
    """Block specs of a per-chunk kernel with grid (B, heads, NC) (or (B, NC, G) when
    `chunk_axis` is 1)."""

    def __init__(self, layout: Layout, st: Static, num_chunks: int, chunk_axis: int = 2):
        self.layout, self.st, self.C = layout, st, st.blocks.chunk
        self.num_chunks = num_chunks
        self.chunk_axis = chunk_axis

    def _bhc(self, grid):
        b, x, y = grid
        return (b, x, y) if self.chunk_axis == 2 else (b, y, x)  # (batch, head, chunk)

    def head(self, d):
        """This query head's chunk."""
        return self.layout.seq(self.C, d, lambda *g: self._bhc(g))

    def group(self, d):
        """The chunk of every query head of this kv head (grid over kv heads)."""
        return self.layout.grouped_seq(self.C, self.st.group, d, lambda *g: self._bhc(g))

    def kv(self, d, heads: str = "query"):
        """A stream-indexed kv-head array (the gates G) at this chunk."""
        group = self.st.group if heads == "query" else 1
        return self.layout.seq(self.C, d, lambda *g: _kv(self._bhc(g), group))

    def stream(self, d, heads: str = "query"):
        """A slot input (token-indexed) at the token chunk this stream chunk reads."""
        group = self.st.group if heads == "query" else 1
        to_token = lambda c: stream_chunk(self.st, c, self.num_chunks)
        return self.layout.seq(
            self.C, d, lambda *g: (lambda b, h, c: (b, h // group, to_token(c)))(*self._bhc(g)))

    def state(self, d, m, heads: str = "query"):
        group = self.st.group if heads == "query" else 1
        return pl.BlockSpec((None, None, None, d, m),
                            lambda *g: (lambda b, h, c: (b, c, h // group, 0, 0))(*self._bhc(g)))

    def row(self):
        return self.layout.rows_spec(self.C, lambda *g: self._bhc(g))


def _kv(bhc, group):
    b, h, c = bhc
    return b, h // group, c


def _call(kernel, layout: Layout, st: Static, grid, in_specs, out_specs, out_shape, warps, name,
          **kwargs):
    return pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        compiler_params=layout.params(st, warps, len(grid), False),
        interpret=layout.interpret(st), name=name, **kwargs)


def chunk_prepare(ks, vs, ss, gs, st: Static, layout: Layout):
    """Per chunk, in parallel: the cumulative log gates G (float32, shape of gs), the chunk's
    writes to the slot states as seen at its end, ΔK̃ `[B, NC, G, K, M]` and ΔṼᵀ
    `[B, NC, G, V, M]` (Σ_j k̄_j (s̄_j ⊙ e^{G_last − G_j})ᵀ), and its log decay G_last
    `[B, NC, G, 1, M]`; float32."""
    batch, length, kv_heads, slots = _dims(ss, layout)
    key_dim, value_dim = ks.shape[-1], vs.shape[-1]
    num_chunks = length // st.blocks.chunk
    specs = _Specs(layout, st, num_chunks, chunk_axis=1)

    def kernel(ks_ref, vs_ref, ss_ref, gs_ref, gc_ref, kd_ref, vd_ref, decay_ref):
        valid = chunk_valid(st, 1)
        g = jnp.where(valid, gs_ref[...].astype(F32), 0.0)
        G = layout.cumsum(g)
        last = jnp.sum(g, axis=0, keepdims=True)
        gc_ref[...] = G
        written = jnp.where(valid, ss_ref[...].astype(F32), 0.0) * jnp.exp(last - G)
        kd_ref[...] = mm_tn(ks_ref[...].astype(F32), written)
        vd_ref[...] = mm_tn(vs_ref[...].astype(F32), written)
        decay_ref[...] = last

    states = lambda d: jax.ShapeDtypeStruct((batch, num_chunks, kv_heads, d, slots), F32)
    return _call(
        kernel, layout, st, (batch, num_chunks, kv_heads),
        [specs.stream(d, "kv") for d in (key_dim, value_dim, slots, slots)],
        [specs.kv(slots, "kv"), specs.state(key_dim, slots, "kv"),
         specs.state(value_dim, slots, "kv"), specs.state(1, slots, "kv")],
        [jax.ShapeDtypeStruct(gs.shape, F32), states(key_dim), states(value_dim), states(1)],
        4, "nha_chunk_prepare",
    )(ks, vs, ss, gs)


def chunk_deltas_reverse(q, da, do, p, gc, st: Static, layout: Layout):
    """Per chunk, in parallel, the chunk's queries' pull on the state entering it, summed over
    each kv head's group: scale·Σ_t q_t (dA_t ⊙ e^{G_t})ᵀ `[B, NC, G, K, M]` and
    Σ_t dO_t (P_t ⊙ e^{G_t})ᵀ `[B, NC, G, V, M]`, float32."""
    batch, length, kv_heads, slots = _dims(gc, layout)
    key_dim, value_dim, group = q.shape[-1], do.shape[-1], st.group
    num_chunks = length // st.blocks.chunk
    specs = _Specs(layout, st, num_chunks, chunk_axis=1)

    def kernel(q_ref, da_ref, do_ref, p_ref, gc_ref, kd_ref, vd_ref):
        entry = jnp.exp(gc_ref[...])
        C = entry.shape[0]
        kd = vd = 0.0
        for r in range(group):
            rows = lambda ref, r=r: layout.head_rows(ref, r)(0, C)
            kd += mm_tn(rows(q_ref).astype(F32), rows(da_ref) * entry)
            vd += mm_tn(rows(do_ref).astype(F32), rows(p_ref) * entry)
        kd_ref[...] = st.scale * kd
        vd_ref[...] = vd

    states = lambda d: jax.ShapeDtypeStruct((batch, num_chunks, kv_heads, d, slots), F32)
    return _call(
        kernel, layout, st, (batch, num_chunks, kv_heads),
        [specs.group(key_dim), specs.group(slots), specs.group(value_dim), specs.group(slots),
         specs.kv(slots, "kv")],
        [specs.state(key_dim, slots, "kv"), specs.state(value_dim, slots, "kv")],
        [states(key_dim), states(value_dim)], 4, "nha_chunk_deltas_reverse",
    )(*(layout.grouped(x, group) for x in (q, da, do, p)), gc)


def slot_logits(q, ks, ss, gc, key_states, st: Static, layout: Layout) -> jax.Array:
    """Scaled slot logits `scale·K̃_tᵀ q_t` of every step, float32, q's shape with M features."""
    batch, length, heads, key_dim = _dims(q, layout)
    slots = ss.shape[-1]
    specs = _Specs(layout, st, length // st.blocks.chunk)

    def kernel(q_ref, ks_ref, ss_ref, gc_ref, kst_ref, out_ref):
        q = q_ref[...]
        writes = masked(rows_of(ss_ref), chunk_valid(st, 2))
        [logits] = slot_scores([(q, rows_of(ks_ref), kst_ref[...])], writes,
                               rows_of(gc_ref), S=st.blocks.sub_chunk,
                               dtype=slot_dtype(st, q.dtype))
        out_ref[...] = st.scale * logits

    return _call(
        kernel, layout, st, (batch, heads, length // st.blocks.chunk),
        [specs.head(key_dim), specs.stream(key_dim), specs.stream(slots), specs.kv(slots),
         specs.state(key_dim, slots)],
        specs.head(slots), jax.ShapeDtypeStruct(q.shape[:-1] + (slots,), F32),
        st.blocks.slot_num_warps, "nha_slot_logits",
    )(q, ks, ss, gc, key_states)


def slot_readout_add(o_window, logits, lse, vs, ss, gc, value_states, st: Static,
                     layout: Layout):
    """o = o_window + Ṽ_tᵀ P_slots with P_slots = exp(logits − lse) (masked), float32,
    written over o_window."""
    batch, length, heads, value_dim = _dims(o_window, layout)
    slots = ss.shape[-1]
    C = st.blocks.chunk
    specs = _Specs(layout, st, length // C)

    def kernel(o_ref, a_ref, lse_ref, vs_ref, ss_ref, gc_ref, vst_ref, out_ref):
        rows = pl.program_id(2) * C + iota((C, 1), 0)
        p = jnp.where(visible(rows, st), jnp.exp(a_ref[...] - lse_ref[...][:, None]), 0.0)
        writes = masked(rows_of(ss_ref), chunk_valid(st, 2))
        out_ref[...] = o_ref[...] + slot_readout(
            p, writes, rows_of(vs_ref), rows_of(gc_ref), vst_ref[...],
            S=st.blocks.sub_chunk, dtype=slot_dtype(st, vs_ref.dtype))

    return _call(
        kernel, layout, st, (batch, heads, length // C),
        [specs.head(value_dim), specs.head(slots), specs.row(), specs.stream(value_dim),
         specs.stream(slots), specs.kv(slots), specs.state(value_dim, slots)],
        specs.head(value_dim), jax.ShapeDtypeStruct(o_window.shape, F32),
        st.blocks.slot_num_warps, "nha_slot_readout", input_output_aliases={0: 0},
    )(o_window, logits, lse, vs, ss, gc, value_states)


def slot_backward_queries(q, logits, lse, delta, do, slot_inputs, st: Static, layout: Layout):
    """Slot part of the query-side backward: dq (dtype of q) and float32 dA (gradient of the
    scaled logits), P (slot probabilities) and this head's part of the log-gate gradient
    dA ⊙ A + P ⊙ dP (the last three with M features)."""
    ks, vs, ss, gc, key_states, value_states = slot_inputs
    batch, length, heads, key_dim = _dims(q, layout)
    value_dim, slots = do.shape[-1], ss.shape[-1]
    C, S = st.blocks.chunk, st.blocks.sub_chunk
    specs = _Specs(layout, st, length // C)

    def kernel(q_ref, a_ref, lse_ref, delta_ref, do_ref, ks_ref, vs_ref, ss_ref, gc_ref, kst_ref,
               vst_ref, dq_ref, da_ref, p_ref, qg_ref):
        rows = pl.program_id(2) * C + iota((C, 1), 0)
        do, logits = do_ref[...], a_ref[...]
        dtype = slot_dtype(st, do.dtype, gradient=True)
        gate = rows_of(gc_ref)
        writes = masked(rows_of(ss_ref), chunk_valid(st, 2))
        [dp] = slot_scores([(do, rows_of(vs_ref), vst_ref[...])], writes, gate, S=S,
                           dtype=slot_dtype(st, do.dtype))
        p = jnp.where(visible(rows, st), jnp.exp(logits - lse_ref[...][:, None]), 0.0)
        da = p * (dp - delta_ref[...][:, None])
        dq = slot_readout(da, writes, rows_of(ks_ref), gate, kst_ref[...], S=S,
                          dtype=dtype)
        dq_ref[...] = (st.scale * dq).astype(dq_ref.dtype)
        da_ref[...] = da
        p_ref[...] = p
        qg_ref[...] = da * logits + p * dp

    slot_shape = jax.ShapeDtypeStruct(q.shape[:-1] + (slots,), F32)
    return _call(
        kernel, layout, st, (batch, heads, length // C),
        [specs.head(key_dim), specs.head(slots), specs.row(), specs.row(),
         specs.head(value_dim), specs.stream(key_dim), specs.stream(value_dim),
         specs.stream(slots), specs.kv(slots), specs.state(key_dim, slots),
         specs.state(value_dim, slots)],
        [specs.head(key_dim)] + [specs.head(slots)] * 3,
        [jax.ShapeDtypeStruct(q.shape, q.dtype)] + [slot_shape] * 3,
        st.blocks.slot_backward_num_warps, "nha_slot_backward_queries",
    )(q, logits, lse, delta, do, ks, vs, ss, gc, key_states, value_states)


def _backward_slots_kernel(q_ref, do_ref, da_ref, p_ref, qg_ref, ks_ref, vs_ref, ss_ref, gc_ref,
                           kend_ref, vend_ref, dks_ref, dvs_ref, dss_ref, dg_ref, *, st: Static,
                           layout: Layout):
    heads = [tuple(layout.head_rows(ref, r) for ref in (q_ref, do_ref, da_ref, p_ref))
             for r in range(st.group)]
    valid = chunk_valid(st, 2)  # else: tokens that never enter the slots, gradient 0
    s_in = jnp.where(valid, ss_ref[...].astype(F32), 0.0)
    C = s_in.shape[0]
    dk, dv, ds = slot_input_grads(
        heads, ks_ref[...], vs_ref[...], s_in, rows_of(gc_ref), kend_ref[...],
        vend_ref[...], S=st.blocks.sub_chunk, scale=st.scale,
        dtype=slot_dtype(st, ks_ref.dtype, gradient=True), ds_dtype=slot_dtype(st, ks_ref.dtype))
    dG = sum(layout.head_rows(qg_ref, r)(0, C) for r in range(st.group)) - s_in * ds
    # The log gate g_j enters every G_t with t ≥ j: reverse cumulative sum within the chunk.
    dg_ref[...] = jnp.where(valid, layout.reverse_cumsum(dG), 0.0)
    dks_ref[...] = jnp.where(valid, dk, 0.0).astype(dks_ref.dtype)
    dvs_ref[...] = jnp.where(valid, dv, 0.0).astype(dvs_ref.dtype)
    dss_ref[...] = jnp.where(valid, ds, 0.0).astype(dss_ref.dtype)


def backward_slot_inputs(q, do, slot_grads, slot_inputs, k_end, vt_end, st: Static,
                         layout: Layout):
    """Gradients of the slot inputs `(dk̄, dv̄, ds̄)` and, float32, the reverse cumulative sum
    of the log-gate gradient within each stream chunk (api.py adds the later chunks), all in
    the layout of the slot inputs (token chunks when shift_chunks > 0)."""
    da, p, qg = slot_grads
    ks, vs, ss, gc = slot_inputs[:4]
    batch, length, kv_heads, key_dim = _dims(ks, layout)
    value_dim, slots, group = vs.shape[-1], ss.shape[-1], st.group
    specs = _Specs(layout, st, length // st.blocks.chunk)
    return _call(
        functools.partial(_backward_slots_kernel, st=st, layout=layout), layout, st,
        (batch, kv_heads, length // st.blocks.chunk),
        [specs.group(key_dim), specs.group(value_dim), specs.group(slots), specs.group(slots),
         specs.group(slots), specs.stream(key_dim, "kv"), specs.stream(value_dim, "kv"),
         specs.stream(slots, "kv"), specs.kv(slots, "kv"), specs.state(key_dim, slots, "kv"),
         specs.state(value_dim, slots, "kv")],
        [specs.stream(d, "kv") for d in (key_dim, value_dim, slots, slots)],
        [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (ks, vs, ss)]
        + [jax.ShapeDtypeStruct(ss.shape, F32)],
        st.blocks.slot_backward_num_warps, "nha_backward_slot_inputs",
    )(*(layout.grouped(x, group) for x in (q, do, da, p, qg)), ks, vs, ss, gc, k_end, vt_end)
