"""The per-chunk slot kernels of NHA, written once for both backends (`layout.Layout`).

Each program owns one chunk of C steps of one head (or of one kv head's group of query heads)
and the slot state entering that chunk (`chunk_math` does the chunk's math):

  chunk_prepare         gate cumsum G, the chunk's writes to the slot states, its decay
  slot_logits           scale·K̃_tᵀ q_t for every step
  slot_readout_add      o += Ṽ_tᵀ P_t with the final softmax weights of the slots
  slot_readout          o = Ṽ_tᵀ softmax(ℓ_t) and its log-sum-exp (w = 0: no window kernel)
  slot_backward_queries dq, dA = P ⊙ (dP − D), P, and the query part of the log-gate gradient
  chunk_deltas_reverse  the chunk's pull on the state gradients
  backward_slot_inputs  dk̄, dv̄, ds̄ and the log-gate gradient (reverse cumsum in the chunk)

The four slot kernels (logits to backward_slot_inputs) depend on the chunk's path
(`chunk_math`): on the GPU each is two launches, one over the chunks on the fast path and one
over those on the exact path, each holding only its path's code (`_call`).

Arrays are in the layout's order (`[B, T, H, d]` or `[B, H, T, d]`); slot states are
`[B, NC, G, X, M]` float32; per-row arrays (lse, D) `[B, H, T]` in the layout's `row_vectors`
form. With documents (`docs`, a
`SlotDocs`) the kernels also read per-token `[B, T]` int32 arrays: σ and the start flags of the
slot inputs (stream order, `chunk_math`), and which query rows' slots hold a token of their
document.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.base2 import exp
from pallas_kernels.call import pallas_call
from pallas_kernels.nha.chunk_math import (
    F32,
    MASK_VALUE,
    InputSide,
    Rows,
    exiting,
    fast_path,
    iota,
    rows_of,
    slot_input_grads,
    slot_input_grads_tiled,
    slot_readout_tiled,
    slot_scores,
    slot_scores_tiled,
)
from pallas_kernels.nha.chunk_math import slot_readout as readout_form
from pallas_kernels.nha.layout import (
    Layout,
    Static,
    in_softmax,
    masked,
    slot_products,
    slot_rows,
    stream_chunk,
    stream_rows_valid,
)


class SlotDocs(NamedTuple):
    """Per-token int32 arrays of a call with documents (or an initial state), padded to Tp.

    ids: `[B, P + Tp]` document of every window key position (P = Static.offset positions
      before the call), the query at t having ids[P + t]; the window kernels' masks.
    holds: `[B, Tp]` 1 where query t's slots hold a token of its document.
    sigma: `[B, Tp]` σ of the slot inputs, in the stream arrays' order (`chunk_math`).
    starts: `[B, Tp]` 1 where a slot input starts a document (its gate is left out).
    lowest_key, highest_query, unmasked_from, unmasked_until: `[B, P + Tp]` per key position
      t (`Static.document_bounds`; else None), from its document's extent and the window
      (`flash_attention.bounds.visible_span`): the first key query t sees, the last query that
      sees key t; every key in [unmasked_from, t] is visible from query t, and key t from every
      query in [t, unmasked_until] (the window kernels skip the mask of blocks inside them).
    """

    ids: jax.Array
    holds: jax.Array
    sigma: jax.Array
    starts: jax.Array
    lowest_key: jax.Array | None = None
    highest_query: jax.Array | None = None
    unmasked_from: jax.Array | None = None
    unmasked_until: jax.Array | None = None


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

    def _to_token(self, c):
        return stream_chunk(self.st, c, self.num_chunks)

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
        return self.layout.seq(
            self.C, d,
            lambda *g: (lambda b, h, c: (b, h // group, self._to_token(c)))(*self._bhc(g)))

    def state(self, d, m, heads: str = "query"):
        group = self.st.group if heads == "query" else 1
        return pl.BlockSpec((None, None, None, d, m),
                            lambda *g: (lambda b, h, c: (b, c, h // group, 0, 0))(*self._bhc(g)))

    def row(self):
        return self.layout.rows_spec(self.C, lambda *g: self._bhc(g))

    def token_rows(self, stream: bool):
        """This chunk of a per-token `[B, Tp]` array: in stream order (the slot inputs' σ and
        starts) or in query order (holds)."""
        to = self._to_token if stream else (lambda c: c)
        return self.layout.tokens_spec(
            self.C, lambda *g: (lambda b, h, c: (b, to(c)))(*self._bhc(g)))


_QUERY_DOCS = ("sigma", "holds")  # the document arrays of the per-query-head slot kernels


def _kv(bhc, group):
    b, h, c = bhc
    return b, h // group, c


def _call(kernel, layout: Layout, st: Static, grid, in_specs, out_specs, out_shape, warps, name,
          stages=1, gate: jax.Array | None = None, aliases: dict[int, int] | None = None):
    """The `pallas_call` of a per-chunk kernel. A slot kernel (`gate`: the gates G, one of the
    arrays it is called on; grid axis 2 its chunks) is `kernel(*refs, path=..., chunk=...)`
    (`chunk_math.PATHS`; chunk: the program's chunk, read before a branch, where interpret
    mode cannot lower `program_id`): with `Layout.split_paths` it runs twice, first on the
    chunks `chunk_math.fast_path` takes (the others left unwritten), then, named `name_exact`,
    on the rest, its outputs aliased to the first run's, so that each kernel holds one path's
    code (NOTES.md, session 26); else once, on "both"."""
    call = lambda body, specs, aliases, name=name: pallas_call(
        body, grid=grid, in_specs=specs, out_specs=out_specs, out_shape=out_shape,
        compiler_params=layout.params(st, warps, len(grid), False, stages),
        interpret=layout.interpret(st), name=name, input_output_aliases=aliases or {})
    if gate is None:
        return call(kernel, in_specs, aliases)
    if not layout.split_paths:
        return call(lambda *refs: kernel(*refs, path="both", chunk=pl.program_id(2)), in_specs,
                    aliases)
    aliases = aliases or {}
    many = isinstance(out_shape, (list, tuple))
    num_outs = len(out_shape) if many else 1
    free = [i for i in range(num_outs) if i not in aliases.values()]  # outputs not yet inputs

    def on(path: str, num_extra: int, at: int):
        def body(*refs):
            fast, chunk = fast_path(rows_of(refs[at]), st.blocks.chunk), pl.program_id(2)
            refs = refs[:len(in_specs)] + refs[len(in_specs) + num_extra:]
            pl.when(fast if path == "fast" else jnp.logical_not(fast))(
                lambda: kernel(*refs, path=path, chunk=chunk))
        return body

    def run(*args):
        at = next(i for i, x in enumerate(args) if x is gate)
        outs = call(on("fast", 0, at), in_specs, aliases)(*args)
        outs_list = list(outs) if many else [outs]
        args = [outs_list[aliases[i]] if i in aliases else x for i, x in enumerate(args)]
        specs = list(out_specs) if many else [out_specs]
        extra = {len(args) + n: i for n, i in enumerate(free)}
        return call(on("exact", len(free), at), in_specs + [specs[i] for i in free],
                    aliases | extra, f"{name}_exact")(*args, *(outs_list[i] for i in free))

    return run


def _segments(sigma_ref, layout: Layout):
    """The `chunk_math.Segments` loader of a σ block, or None without documents."""
    if sigma_ref is None:
        return None
    return lambda start, size: layout.token_rows(sigma_ref, start, size)


def _doc_refs(refs, names, st: Static):
    """Splits a kernel's refs into (refs without the document arrays, {name: ref or None})."""
    if not st.documents:
        return list(refs), dict.fromkeys(names)
    refs = list(refs)
    return refs[len(names):], dict(zip(names, refs[:len(names)], strict=True))


def _doc_args(docs: SlotDocs | None, specs: _Specs, names) -> tuple[list, list]:
    """(in_specs, arrays) of the document arrays `names` a kernel reads (none without docs)."""
    if docs is None:
        return [], []
    order = dict(sigma=True, starts=True, holds=False)
    return ([specs.token_rows(order[name]) for name in names],
            [specs.layout.token_vectors(getattr(docs, name)) for name in names])


def chunk_prepare(ks, vs, ss, gs, docs: SlotDocs | None, st: Static, layout: Layout):
    """Per chunk, in parallel: the cumulative log gates G (float32, shape of gs; document
    starts' gates left out), the chunk's writes to the slot states as seen at its end, ΔK̃
    `[B, NC, G, K, M]` and ΔṼᵀ `[B, NC, G, V, M]` (Σ_j k̄_j (s̄_j ⊙ e^{G_last − G_j})ᵀ over
    the writes after the chunk's last document start), and its log decay G_last
    `[B, NC, G, 1, M]` (MASK_VALUE when a document starts in the chunk); float32."""
    batch, length, kv_heads, slots = _dims(ss, layout)
    key_dim, value_dim = ks.shape[-1], vs.shape[-1]
    num_chunks = length // st.blocks.chunk
    specs = _Specs(layout, st, num_chunks, chunk_axis=1)
    products = slot_products(st, ks.dtype).state
    names = ("sigma", "starts")

    def kernel(*refs):
        refs, doc = _doc_refs(refs, names, st)
        ks_ref, vs_ref, ss_ref, gs_ref, gc_ref, kd_ref, vd_ref, decay_ref = refs
        C = st.blocks.chunk
        valid = stream_rows_valid(st, pl.program_id(1))(0, C)
        if doc["starts"] is None:
            keep = valid
        else:
            keep = valid & (layout.token_rows(doc["starts"], 0, C)[:, None] == 0)
        g = jnp.where(keep, gs_ref[...].astype(F32), 0.0)
        G = layout.cumsum(g)
        # The chunk's total is G's last row, not a separate sum of g: the backward takes the
        # writes as e^{G_last − G_j} with G_last read from G, and a differently rounded total
        # (the TPU's triangular-matmul cumsum) cost the gate gradients 30× (NOTES.md).
        last = jnp.sum(jnp.where(iota((C, 1), 0) == C - 1, G, 0.0), axis=0, keepdims=True)
        gc_ref[...] = G
        # jnp.exp, not `base2.exp`: 2^(x·log₂e) made this kernel 10 % slower (NOTES.md,
        # session 29).
        written = jnp.where(valid, ss_ref[...].astype(F32), 0.0) * jnp.exp(last - G)
        sigma = _segments(doc["sigma"], layout)
        if sigma is not None:
            written = jnp.where(exiting(sigma, C), written, 0.0)
            last = jnp.where(sigma(C - 1, 1)[None, :] == 0, last, MASK_VALUE)
        kd_ref[...] = products.mm_tn(ks_ref[...], written, exact_a=True)
        vd_ref[...] = products.mm_tn(vs_ref[...], written, exact_a=True)
        decay_ref[...] = last

    doc_specs, doc_arrays = _doc_args(docs, specs, names)
    states = lambda d: jax.ShapeDtypeStruct((batch, num_chunks, kv_heads, d, slots), F32)
    return _call(
        kernel, layout, st, (batch, num_chunks, kv_heads),
        doc_specs + [specs.stream(d, "kv") for d in (key_dim, value_dim, slots, slots)],
        [specs.kv(slots, "kv"), specs.state(key_dim, slots, "kv"),
         specs.state(value_dim, slots, "kv"), specs.state(1, slots, "kv")],
        [jax.ShapeDtypeStruct(gs.shape, F32), states(key_dim), states(value_dim), states(1)],
        4, "nha_chunk_prepare",
    )(*doc_arrays, ks, vs, ss, gs)


def chunk_deltas_reverse(q, da, do, p, gc, docs: SlotDocs | None, st: Static, layout: Layout):
    """Per chunk, in parallel, the chunk's queries' pull on the state entering it, summed over
    each kv head's group: scale·Σ_t q_t (dA_t ⊙ e^{G_t})ᵀ `[B, NC, G, K, M]` and
    Σ_t dO_t (P_t ⊙ e^{G_t})ᵀ `[B, NC, G, V, M]` over the rows before the chunk's first
    document start, float32."""
    batch, length, kv_heads, slots = _dims(gc, layout)
    key_dim, value_dim, group = q.shape[-1], do.shape[-1], st.group
    num_chunks = length // st.blocks.chunk
    specs = _Specs(layout, st, num_chunks, chunk_axis=1)
    products = slot_products(st, q.dtype).state

    def kernel(*refs):
        refs, doc = _doc_refs(refs, ("sigma",), st)
        q_ref, da_ref, do_ref, p_ref, gc_ref, kd_ref, vd_ref = refs
        entry = exp(gc_ref[...])
        C = entry.shape[0]
        if doc["sigma"] is not None:
            entry = jnp.where(layout.token_rows(doc["sigma"], 0, C)[:, None] == 0, entry, 0.0)
        kd = vd = 0.0
        for r in range(group):
            rows = lambda ref, r=r: layout.head_rows(ref, r)(0, C)
            kd += products.mm_tn(rows(q_ref), rows(da_ref) * entry, exact_a=True)
            vd += products.mm_tn(rows(do_ref), rows(p_ref) * entry, exact_a=True)
        kd_ref[...] = st.scale * kd
        vd_ref[...] = vd

    doc_specs, doc_arrays = _doc_args(docs, specs, ("sigma",))
    states = lambda d: jax.ShapeDtypeStruct((batch, num_chunks, kv_heads, d, slots), F32)
    return _call(
        kernel, layout, st, (batch, num_chunks, kv_heads),
        doc_specs + [specs.group(key_dim), specs.group(slots), specs.group(value_dim),
                     specs.group(slots), specs.kv(slots, "kv")],
        [specs.state(key_dim, slots, "kv"), specs.state(value_dim, slots, "kv")],
        [states(key_dim), states(value_dim)], 4, "nha_chunk_deltas_reverse",
    )(*doc_arrays, *(layout.grouped(x, group) for x in (q, da, do, p)), gc)


def _held(st: Static, layout: Layout, holds_ref, C: int, chunk: jax.Array):
    """`[C, 1]` bool: query chunk `chunk`'s rows whose slots hold a token of their document."""
    rows = chunk * C + iota((C, 1), 0)
    return slot_rows(st, rows, None if holds_ref is None else layout.token_rows(holds_ref, 0, C))


def _feature_refs(st: Static):
    """How a slot kernel passes its feature-wide tiles (x, a state) on: loaded, or as refs for
    the `BlockSizes.slot_feature_block` loop to load tile by tile."""
    return (lambda ref: ref[...]) if st.blocks.slot_feature_block is None else (lambda ref: ref)


def _feature_stages(st: Static) -> int:
    return 1 if st.blocks.slot_feature_block is None else st.blocks.slot_feature_num_stages


def _pairs_copy(st: Static) -> int:
    """1 where the feature loop is pipelined: the scores form's x goes in a second time, so
    that its pairs product loads its own tiles (`chunk_math.slot_scores_tiled`)."""
    return int(st.blocks.slot_feature_block is not None and _feature_stages(st) > 1)


def _pair_refs(x, copies):
    """x, or (x, its second ref) for `slot_scores_tiled` (`_pairs_copy`)."""
    return (x, copies[0]) if copies else x


def _scores(st: Static, x, keys_ref, x_state, writes: Rows, gate: Rows, products,
            sigma, path: str) -> jax.Array:
    """The scores form `[C, M]` of one (x, keys, state) (`chunk_math.slot_scores`): x and
    x_state as `_feature_refs` passes them."""
    options = dict(S=st.blocks.sub_chunk, state=products.state, intra=products.intra,
                   sigma=sigma, path=path)
    tile = st.blocks.slot_feature_block
    if tile is None:
        return slot_scores([(x, rows_of(keys_ref), x_state)], writes, gate, **options)[0]
    return slot_scores_tiled([(x, rows_of(keys_ref), x_state)], writes, gate, tile=tile,
                             **options)[0]


def _readout(st: Static, p, writes: Rows, u_ref, gate: Rows, state_ref, store, *, state,
             intra, sigma, path: str) -> None:
    """The readout form (`chunk_math.slot_readout`) handed to `store(cols, out)`: whole
    (cols = all features) or, with `BlockSizes.slot_feature_block`, tile by tile."""
    options = dict(S=st.blocks.sub_chunk, state=state, intra=intra, sigma=sigma, path=path)
    tile = st.blocks.slot_feature_block
    if tile is None:
        store(slice(None), readout_form(p, writes, rows_of(u_ref), gate, state_ref[...],
                                        **options))
    else:
        slot_readout_tiled(p, writes, rows_of(u_ref), gate, state_ref, store, tile=tile,
                           **options)


def slot_logits(q, ks, ss, gc, key_states, docs: SlotDocs | None, st: Static,
                layout: Layout) -> jax.Array:
    """Scaled slot logits `scale·K̃_tᵀ q_t` of every step (0 where the slots hold nothing of
    t's document), float32, q's shape with M features."""
    batch, length, heads, key_dim = _dims(q, layout)
    C = st.blocks.chunk
    products = slot_products(st, q.dtype)

    def kernel(*refs, path, chunk):
        refs, doc = _doc_refs(refs, _QUERY_DOCS, st)
        q_ref, ks_ref, ss_ref, gc_ref, kst_ref, *q_pairs, out_ref = refs
        writes = masked(rows_of(ss_ref), stream_rows_valid(st, chunk))
        read = _feature_refs(st)
        logits = _scores(st, _pair_refs(read(q_ref), q_pairs), ks_ref, read(kst_ref), writes,
                         rows_of(gc_ref), products, _segments(doc["sigma"], layout), path)
        out_ref[...] = jnp.where(_held(st, layout, doc["holds"], C, chunk), st.scale * logits, 0.0)

    specs, slots = _Specs(layout, st, length // C), ss.shape[-1]
    doc_specs, doc_arrays = _doc_args(docs, specs, _QUERY_DOCS)
    return _call(
        kernel, layout, st, (batch, heads, length // C),
        doc_specs + [specs.head(key_dim), specs.stream(key_dim), specs.stream(slots),
                     specs.kv(slots), specs.state(key_dim, slots)]
        + [specs.head(key_dim)] * _pairs_copy(st),
        specs.head(slots), jax.ShapeDtypeStruct(q.shape[:-1] + (slots,), F32),
        st.blocks.slot_num_warps, "nha_slot_logits", _feature_stages(st), gate=gc,
    )(*doc_arrays, q, ks, ss, gc, key_states, *[q] * _pairs_copy(st))


def slot_readout_add(o_window, logits, lse, vs, ss, gc, value_states, docs: SlotDocs | None,
                     st: Static, layout: Layout):
    """o = o_window + Ṽ_tᵀ P_slots with P_slots = exp(logits − lse) (masked), float32,
    written over o_window. With o_window and lse None (w = 0) the softmax is over the slots
    alone: returns o and its log-sum-exp `[B, H, T]`."""
    batch, length, heads, slots = _dims(logits, layout)
    value_dim = vs.shape[-1]
    C = st.blocks.chunk
    specs = _Specs(layout, st, length // C)
    products = slot_products(st, vs.dtype)
    alone = o_window is None

    def kernel(*refs, path, chunk):
        refs, doc = _doc_refs(refs, _QUERY_DOCS, st)
        if alone:
            a_ref, vs_ref, ss_ref, gc_ref, vst_ref, out_ref, lse_ref = refs
        else:
            o_ref, a_ref, lse_ref, vs_ref, ss_ref, gc_ref, vst_ref, out_ref = refs
        held = _held(st, layout, doc["holds"], C, chunk)
        a = a_ref[...]
        if alone:
            use = in_softmax(st, held)
            m = jnp.max(jnp.where(use, a, MASK_VALUE), axis=1, keepdims=True)
            e = jnp.where(use, exp(a - m), 0.0)
            total = jnp.sum(e, axis=1, keepdims=True)
            layout.set_column(lse_ref, m + jnp.log(total))
            p = jnp.where(held, e / total, 0.0)
        else:
            p = jnp.where(held, exp(a - layout.column(lse_ref)), 0.0)
        writes = masked(rows_of(ss_ref), stream_rows_valid(st, chunk))

        def store(cols, out):
            out_ref[:, cols] = out if alone else o_ref[:, cols] + out

        _readout(st, p, writes, vs_ref, rows_of(gc_ref), vst_ref, store, state=products.state,
                 intra=products.intra, sigma=_segments(doc["sigma"], layout), path=path)

    doc_specs, doc_arrays = _doc_args(docs, specs, _QUERY_DOCS)
    slot_specs = [specs.stream(value_dim), specs.stream(slots), specs.kv(slots),
                  specs.state(value_dim, slots)]
    out_shape = jax.ShapeDtypeStruct(logits.shape[:-1] + (value_dim,), F32)
    if alone:
        return _call(
            kernel, layout, st, (batch, heads, length // C),
            doc_specs + [specs.head(slots)] + slot_specs, [specs.head(value_dim), specs.row()],
            [out_shape, jax.ShapeDtypeStruct(layout.rows_shape(batch, heads, length), F32)],
            st.blocks.slot_num_warps, "nha_slot_readout", _feature_stages(st), gate=gc,
        )(*doc_arrays, logits, vs, ss, gc, value_states)
    return _call(
        kernel, layout, st, (batch, heads, length // C),
        doc_specs + [specs.head(value_dim), specs.head(slots), specs.row()] + slot_specs,
        specs.head(value_dim), out_shape, st.blocks.slot_num_warps, "nha_slot_readout_add",
        _feature_stages(st), gate=gc, aliases={len(doc_arrays): 0},
    )(*doc_arrays, o_window, logits, lse, vs, ss, gc, value_states)


def slot_readout(logits, vs, ss, gc, value_states, docs: SlotDocs | None, st: Static,
                 layout: Layout):
    """No window (w = 0): o = Ṽ_tᵀ softmax(ℓ_t) over the slots alone, float32, and its
    log-sum-exp `[B, H, T]` (the window kernel is skipped)."""
    return slot_readout_add(None, logits, None, vs, ss, gc, value_states, docs, st, layout)


def slot_backward_queries(q, logits, lse, delta, do, slot_inputs, docs: SlotDocs | None,
                          st: Static, layout: Layout):
    """Slot part of the query-side backward: dq (dtype of q) and float32 dA (gradient of the
    scaled logits), P (slot probabilities) and this head's part of the log-gate gradient
    dA ⊙ A + P ⊙ dP (the last three with M features, 0 where the slots hold nothing). One
    kernel, or with `BlockSizes.split_slot_backward` two: dA, P and the gate part, then dq
    from the dA it wrote (NOTES.md, v7)."""
    ks, vs, ss, gc, key_states, value_states = slot_inputs
    batch, length, heads, key_dim = _dims(q, layout)
    value_dim, slots = do.shape[-1], ss.shape[-1]
    C = st.blocks.chunk
    specs = _Specs(layout, st, length // C)
    products = slot_products(st, q.dtype)
    split = st.blocks.split_slot_backward

    def dq_of(da, writes, gate, sigma, ks_ref, kst_ref, dq_ref, path):
        def store(cols, dq):
            dq_ref[:, cols] = (st.scale * dq).astype(dq_ref.dtype)

        _readout(st, da, writes, ks_ref, gate, kst_ref, store, state=products.state,
                 intra=products.gradient, sigma=sigma, path=path)

    def kernel(*refs, path, chunk):
        refs, doc = _doc_refs(refs, _QUERY_DOCS, st)
        (a_ref, lse_ref, delta_ref, do_ref, vs_ref, ss_ref, gc_ref, vst_ref, *refs) = refs
        do_pairs, refs = refs[:_pairs_copy(st)], refs[_pairs_copy(st):]
        if not split:
            ks_ref, kst_ref, dq_ref, *refs = refs
        da_ref, p_ref, qg_ref = refs
        # The whole-chunk form reads every tile before its first product (NOTES.md, session 13);
        # the feature loop reads the logits after it, which then need not live (spilled at
        # D 256) across the loop and the fast/exact branch (session 18).
        early = st.blocks.slot_feature_block is None
        read = _feature_refs(st)
        do, logits = read(do_ref), a_ref[...] if early else None
        gate = rows_of(gc_ref)
        sigma = _segments(doc["sigma"], layout)
        writes = masked(rows_of(ss_ref), stream_rows_valid(st, chunk))
        dp = _scores(st, _pair_refs(do, do_pairs), vs_ref, read(vst_ref), writes, gate,
                     products, sigma, path)
        logits = logits if early else a_ref[...]
        held = _held(st, layout, doc["holds"], C, chunk)
        p = jnp.where(held, exp(logits - layout.column(lse_ref)), 0.0)
        da = p * (dp - layout.column(delta_ref))
        if not split:
            dq_of(da, writes, gate, sigma, ks_ref, kst_ref, dq_ref, path)
        da_ref[...] = da
        p_ref[...] = p
        qg_ref[...] = da * logits + p * dp

    def dq_kernel(*refs, path, chunk):
        refs, doc = _doc_refs(refs, ("sigma",), st)
        da_ref, ks_ref, ss_ref, gc_ref, kst_ref, dq_ref = refs
        writes = masked(rows_of(ss_ref), stream_rows_valid(st, chunk))
        dq_of(da_ref[...], writes, rows_of(gc_ref), _segments(doc["sigma"], layout), ks_ref,
              kst_ref, dq_ref, path)

    doc_specs, doc_arrays = _doc_args(docs, specs, _QUERY_DOCS)
    slot_shape = jax.ShapeDtypeStruct(q.shape[:-1] + (slots,), F32)
    dq_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    value_specs = [specs.head(slots), specs.row(), specs.row(), specs.head(value_dim),
                   specs.stream(value_dim), specs.stream(slots), specs.kv(slots),
                   specs.state(value_dim, slots)]
    value_arrays = [logits, lse, delta, do, vs, ss, gc, value_states]
    value_specs += [specs.head(value_dim)] * _pairs_copy(st)
    value_arrays += [do] * _pairs_copy(st)
    key_specs, key_arrays = [specs.stream(key_dim), specs.state(key_dim, slots)], [ks, key_states]
    warps = st.blocks.slot_backward_num_warps
    if not split:
        dq, da, p, qg = _call(
            kernel, layout, st, (batch, heads, length // C),
            doc_specs + value_specs + key_specs, [specs.head(key_dim)] + [specs.head(slots)] * 3,
            [dq_shape] + [slot_shape] * 3, warps, "nha_slot_backward_queries",
            _feature_stages(st), gate=gc,
        )(*doc_arrays, *value_arrays, *key_arrays)
        return dq, da, p, qg
    da, p, qg = _call(
        kernel, layout, st, (batch, heads, length // C), doc_specs + value_specs,
        [specs.head(slots)] * 3, [slot_shape] * 3, warps, "nha_slot_backward_probabilities",
        _feature_stages(st), gate=gc,
    )(*doc_arrays, *value_arrays)
    sigma_specs, sigma_arrays = _doc_args(docs, specs, ("sigma",))
    dq = _call(
        dq_kernel, layout, st, (batch, heads, length // C),
        sigma_specs + [specs.head(slots), specs.stream(key_dim), specs.stream(slots),
                       specs.kv(slots), specs.state(key_dim, slots)],
        specs.head(key_dim), dq_shape, warps, "nha_slot_backward_dq", _feature_stages(st),
        gate=gc,
    )(*sigma_arrays, da, ks, ss, gc, key_states)
    return dq, da, p, qg


def _backward_slots_kernel(*refs, st: Static, layout: Layout, part: str, path: str,
                           chunk: jax.Array):
    """part "both": every slot-input gradient; "keys": dk̄ and the keys' part of ds̄ (float32);
    "values": dv̄, then ds̄ (adding the keys' part it reads) and the log-gate gradient."""
    refs, doc = _doc_refs(refs, ("sigma",), st)
    refs = iter(refs)
    take = lambda count: [next(refs) for _ in range(count)]
    heads = lambda in_ref, w_ref: [(layout.head_rows(in_ref, r), layout.head_rows(w_ref, r))
                                   for r in range(st.group)]
    tile = st.blocks.slot_input_block
    read = (lambda ref: ref[...]) if tile is None else (lambda ref: ref)  # tiled: in its loop
    sides = []
    if part != "values":
        q_ref, da_ref, ks_ref, kend_ref = take(4)
        sides.append(InputSide(read(ks_ref), read(kend_ref), heads(q_ref, da_ref), st.scale))
    if part != "keys":
        do_ref, p_ref, qg_ref, vs_ref, vend_ref = take(5)
        sides.append(InputSide(read(vs_ref), read(vend_ref), heads(do_ref, p_ref), 1.0))
    ss_ref, gc_ref = take(2)
    ds_keys_ref = take(1)[0] if part == "values" else None
    outs = list(refs)
    C = st.blocks.chunk
    valid = stream_rows_valid(st, chunk)(0, C)  # else: tokens never entering the slots: 0
    products = slot_products(st, sides[0].x_in.dtype)
    options = dict(S=st.blocks.sub_chunk, intra=products.intra, gradient=products.gradient,
                   sigma=_segments(doc["sigma"], layout), path=path)

    def finish(ds, s_in, slots=None):
        """Stores ds̄'s part (keys), or ds̄ and the log-gate gradient (values, both), of the
        slots `slots` (all when None)."""
        at, cols = (..., ()) if slots is None else ((slice(None), slots), (slots,))
        if part == "keys":
            outs[1][at] = ds
            return
        dss_ref, dg_ref = outs[len(sides):]
        if ds_keys_ref is not None:
            ds = ds + ds_keys_ref[at]
        dG = sum(layout.head_rows(qg_ref, r)(0, C, *cols) for r in range(st.group)) - s_in * ds
        # The log gate g_j enters every G_t with t ≥ j: reverse cumulative sum within the
        # chunk (api.py adds the later chunks and zeroes the document starts' gates).
        dg_ref[at] = jnp.where(valid, layout.reverse_cumsum(dG), 0.0)
        dss_ref[at] = jnp.where(valid, ds, 0.0).astype(dss_ref.dtype)

    if tile is None:
        s_in = jnp.where(valid, ss_ref[...].astype(F32), 0.0)
        dxs, ds = slot_input_grads(sides, s_in, rows_of(gc_ref), **options)
        for out_ref, dx in zip(outs[:len(dxs)], dxs, strict=True):
            out_ref[...] = jnp.where(valid, dx, 0.0).astype(out_ref.dtype)
        finish(ds, s_in)
        return

    def store(out_ref, cols, dx):
        out_ref[:, cols] = jnp.where(valid, dx, 0.0).astype(out_ref.dtype)

    slots, slot_tile = ss_ref.shape[-1], st.blocks.slot_input_slot_block
    slot_input_grads_tiled(
        sides, [functools.partial(store, out_ref) for out_ref in outs[:len(sides)]],
        lambda cols: jnp.where(valid, ss_ref[:, cols].astype(F32), 0.0), rows_of(gc_ref),
        finish, tile=tile, slot_tile=slot_tile if slots % slot_tile == 0 else slots, **options)


def backward_slot_inputs(q, do, slot_grads, slot_inputs, k_end, vt_end, docs: SlotDocs | None,
                         st: Static, layout: Layout):
    """Gradients of the slot inputs `(dk̄, dv̄, ds̄)` and, float32, the reverse cumulative sum
    of the log-gate gradient within each stream chunk (api.py adds the later chunks), all in
    the layout of the slot inputs (token chunks when shift_chunks > 0). One kernel, or with
    `BlockSizes.split_slot_backward` two: the keys' half, then the values' half (NOTES.md, v7)."""
    da, p, qg = slot_grads
    ks, vs, ss, gc = slot_inputs[:4]
    batch, length, kv_heads, key_dim = _dims(ks, layout)
    value_dim, slots, group = vs.shape[-1], ss.shape[-1], st.group
    specs = _Specs(layout, st, length // st.blocks.chunk)
    doc_specs, doc_arrays = _doc_args(docs, specs, ("sigma",))
    grouped = lambda x: layout.grouped(x, group)
    key_args = ([specs.group(key_dim), specs.group(slots), specs.stream(key_dim, "kv"),
                 specs.state(key_dim, slots, "kv")], [grouped(q), grouped(da), ks, k_end])
    value_args = ([specs.group(value_dim), specs.group(slots), specs.group(slots),
                   specs.stream(value_dim, "kv"), specs.state(value_dim, slots, "kv")],
                  [grouped(do), grouped(p), grouped(qg), vs, vt_end])
    gate_args = ([specs.stream(slots, "kv"), specs.kv(slots, "kv")], [ss, gc])
    out = lambda x, dtype=None: (specs.stream(x.shape[-1], "kv"),
                                 jax.ShapeDtypeStruct(x.shape, dtype or x.dtype))

    def call(part, args, outs):
        in_specs, arrays = (sum(parts, []) for parts in zip(*args, strict=True))
        out_specs, out_shapes = zip(*outs, strict=True)
        return _call(
            functools.partial(_backward_slots_kernel, st=st, layout=layout, part=part), layout,
            st, (batch, kv_heads, length // st.blocks.chunk), doc_specs + in_specs,
            list(out_specs), list(out_shapes), st.blocks.slot_backward_num_warps,
            f"nha_backward_slot_inputs{'' if part == 'both' else '_' + part}",
            st.blocks.slot_input_num_stages if st.blocks.slot_input_block else 1, gate=gc,
        )(*doc_arrays, *arrays)

    value_outs = [out(vs), out(ss), out(ss, F32)]
    if not st.blocks.split_slot_backward:
        dks, dvs, dss, dg = call("both", [key_args, value_args, gate_args],
                                 [out(ks)] + value_outs)
        return dks, dvs, dss, dg
    dks, ds_keys = call("keys", [key_args, gate_args], [out(ks), out(ss, F32)])
    dvs, dss, dg = call("values", [value_args, gate_args, ([specs.stream(slots, "kv")],
                                                            [ds_keys])], value_outs)
    return dks, dvs, dss, dg
