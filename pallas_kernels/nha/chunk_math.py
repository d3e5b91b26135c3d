"""Per-chunk math of NHA shared by the GPU and TPU kernels (values and refs of one chunk).

One head, one chunk of C steps of the slot stream (the inputs that enter the slots, shifted by
the window), local rows 0..C−1. G `[C, M]` is the cumulative log gate from the chunk start,
inclusive (non-increasing down the rows); the state entering the chunk reaches row t with decay
e^{G_t}, a write at row j reaches row t ≥ j with e^{G_t − G_j}. Four forms appear:

  scores   out_t = e^{G_t}·(x_t S) + Σ_{j≤t} (x_t·x'_j) e^{G_t − G_j} ⊙ y_j          `[C, M]`
           (slot logits: x = q, x' = k̄, y = s̄, S = K̃; dP of the slots: x = dO, x' = v̄)
  readout  out_t = (p_t ⊙ e^{G_t}) Sᵀ + Σ_{j≤t} (Σ_m p_tm e^{G_tm − G_jm} y_jm) u_j   `[C, Y]`
           (slot values: p = P, u = v̄, Sᵀ = Ṽᵀ; dq: p = dA, u = k̄, Sᵀ = K̃)
  and their transposes, summed over the query rows t ≥ n for each key row n (the slot-input
  gradients, `slot_input_grads`).

The per-slot decay e^{G_t − G_j} is a `[C, C, M]` tensor; it is never built. Fast path (taken when
every slot decays by less than e^{−60} over the chunk, i.e. almost always): one factorisation at the
chunk start, e^{G_t}·e^{−G_j}, both factors within float32 range (≤ e^{60}), so each form is two
chunk-sized matmuls. Otherwise (strong gates) the exact path, whose factors stay within float32
range whatever the gates (a factor that underflows to 0 belongs to a pair whose true weight is below
the float range anyway). The pairs of different sub-chunks (S rows) are factorised at a sub-chunk
boundary r as e^{G_t − G_r}·e^{G_r − G_j}: for the query-row forms r is the last row of the key
sub-chunk and the query rows come after it, for the key-row forms r is the first row of the query
sub-chunk and the key rows come before it. The pairs inside one sub-chunk are split by level, as the
XLA rung splits a whole chunk (`hybrid_jax.ops.gsa`): blocks of b = 2, 4, …, S rows, j in the left
and t in the right half of a block, factorised at the left half's last row; and the pairs j = t,
factors 1 (`_diagonal_pieces`). Each piece is one product, over full chunk rows with the factors 0
outside it. When no sub-chunk decays past e^{−60} (strong gates, usually) the pairs inside the
sub-chunks are one piece instead, factorised at each sub-chunk's last row (factors ≤ e^{60}, as on
the fast path). (Until session 26 the sub-chunk boundary factorised the diagonal sub-chunk too, one
factor up to e^{|ΔG|}: float32 overflowed, NaN on the kernels only, once S − 1 consecutive log gates
of one slot summed below −87.) Rows outside a piece are masked before `exp`, so nothing overflows
there. Each form takes a `path` (`PATHS`): on the GPU a kernel holds one path's code and runs on the
chunks `fast_path` sends it, where both paths in one kernel cost the fast path registers
(`slot_kernels._call`); on the TPU a `lax.cond` per chunk.

Documents (packed sequences). A document start among the chunk's slot inputs empties the slots
before that input enters; per chunk it is described by σ `[C]` int32, the number of starts in
rows ≤ t (`Segments`). Then the entering state reaches row t only while σ_t = 0, a write at row j
reaches row t ≥ j only while σ_j = σ_t, and the gates of the start rows are left out of G (the
state they would decay is gone anyway), so G and the fast path stay as without documents.

Every dot accumulates in float32; `Products` says how each takes its operands
(`layout.slot_products`: float32 — TF32 on the GPU —, the 16-bit type, or a hi + lo split).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import matmul
from pallas_kernels.base2 import exp

F32 = jnp.float32
MASK_VALUE = -1e30
"""Logit of a masked entry: finite, so running maxima never meet inf − inf."""

Rows = Callable[[int, int], jax.Array]
"""`rows(start, size)` loads rows start..start+size−1 of one head's chunk: `[size, X]`."""

Segments = Callable[[int, int], jax.Array]
"""`sigma(start, size)`: σ of rows start..start+size−1, `[size]` int32 (module docstring)."""


def _split(x: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """x ≈ hi + lo with hi, lo of the 16-bit `dtype` (about 16 mantissa bits of x)."""
    hi = x.astype(dtype)
    return hi, (x.astype(F32) - hi.astype(F32)).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Products:
    """How a slot product takes its operands; every product accumulates in float32.

    narrow: the 16-bit type (bfloat16), or the inputs' 32-bit type (then every product is
    32-bit); exact: the inputs' dtype (an operand flagged exact is a value of it: q, k, v, dO);
    wide: how a float32 operand is taken: "float32", "narrow" or "split" (hi + lo). Two exact
    16-bit operands are multiplied as they are (exact, no rounding).
    """

    narrow: Any
    exact: Any
    wide: str

    def dot(self, a, b, matmul, exact_a: bool = False, exact_b: bool = False) -> jax.Array:
        """`matmul(a, b)` (one of `pallas_kernels.matmul`'s) with the operands so taken."""
        narrow = self.narrow
        if jnp.dtype(narrow).itemsize == 4:
            return matmul(a.astype(narrow), b.astype(narrow))
        exact_a, exact_b = (e and jnp.dtype(self.exact) == jnp.dtype(narrow)
                            for e in (exact_a, exact_b))
        if (exact_a and exact_b) or self.wide == "narrow":
            return matmul(a.astype(narrow), b.astype(narrow))
        if self.wide == "float32":
            return matmul(a.astype(F32), b.astype(F32))
        a_parts = (a.astype(narrow),) if exact_a else _split(a, narrow)
        b_parts = (b.astype(narrow),) if exact_b else _split(b, narrow)
        out = matmul(a_parts[0], b_parts[0])  # hi·hi, then the two cross terms (lo·lo dropped)
        if len(b_parts) == 2:
            out += matmul(a_parts[0], b_parts[1])
        if len(a_parts) == 2:
            out += matmul(a_parts[1], b_parts[0])
        return out

    def operand(self, x: jax.Array) -> jax.Array:
        """A float32 operand as these products take it, made once: a value that is kept (a
        loop's invariant operand) then takes 16 bits where its products round it anyway."""
        narrow = jnp.dtype(self.narrow).itemsize == 4 or self.wide == "narrow"
        return x.astype(self.narrow) if narrow else x

    def mm(self, a, b, exact_a: bool = False, exact_b: bool = False) -> jax.Array:
        """a @ b."""
        return self.dot(a, b, matmul.mm, exact_a, exact_b)

    def mm_nt(self, a, b, exact_a: bool = False, exact_b: bool = False) -> jax.Array:
        """a @ bᵀ."""
        return self.dot(a, b, matmul.mm_nt, exact_a, exact_b)

    def mm_tn(self, a, b, exact_a: bool = False, exact_b: bool = False) -> jax.Array:
        """aᵀ @ b."""
        return self.dot(a, b, matmul.mm_tn, exact_a, exact_b)


def iota(shape: tuple[int, int], axis: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def rows_of(ref, *index) -> Rows:
    """Row loader for `ref[rows, *index, cols]` (index selects e.g. a head of a GQA group;
    cols: all features, or a slice)."""
    return lambda start, size, cols=slice(None): ref[(pl.ds(start, size), *index, cols)]


def window_mask(rows: jax.Array, cols: jax.Array, window: int) -> jax.Array:
    """Key position `cols` is in the window of query position `rows` (t − w < j ≤ t)."""
    return (cols <= rows) & (cols > rows - window)


FAST_PATH_LIMIT = 60.0
"""Largest slot log-decay over one chunk for the single-factorisation path (e^{60} ≈ 1e26)."""


PATHS = ("fast", "exact", "both")
"""A form's `path`: the fast path alone, the exact path alone (each right only on the chunks
`fast_path` sends it: a kernel of each, GPU), or the one the chunk needs (`lax.cond`, TPU)."""


def fast_path(g: Rows, C: int) -> jax.Array:
    """Every slot's cumulative log gate over the chunk (its last row) stays above −60."""
    return jnp.min(g(C - 1, 1)) >= -FAST_PATH_LIMIT


def _on_path(path: str, g: Rows, C: int, fast: Callable, exact: Callable):
    """fast() or exact(): the one `path` names, or for "both" the one this chunk needs."""
    if path == "both":
        return lax.cond(fast_path(g, C), fast, exact)
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return fast() if path == "fast" else exact()


def _causal(C: int) -> jax.Array:
    """`[C, C]`: key row j ≤ query row t."""
    return iota((C, C), 0) >= iota((C, C), 1)


def _and(mask: jax.Array, other: jax.Array | None) -> jax.Array:
    return mask if other is None else mask & other


def _same_segment(sigma: Segments | None, C: int, start: int, size: int) -> jax.Array | None:
    """`[C, size]`: row r of the chunk and row start + c lie in the same document (None: no
    documents)."""
    if sigma is None:
        return None
    return sigma(0, C)[:, None] == sigma(start, size)[None, :]


def _entering(sigma: Segments | None, C: int) -> jax.Array | None:
    """`[C, 1]`: the state entering the chunk reaches row t (no document starts at rows ≤ t)."""
    return None if sigma is None else sigma(0, C)[:, None] == 0


def exiting(sigma: Segments | None, C: int) -> jax.Array | None:
    """`[C, 1]`: row n's write reaches the chunk end (no document starts after it)."""
    return None if sigma is None else sigma(0, C)[:, None] == sigma(C - 1, 1)[None, :]


def _masked(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    return x if mask is None else jnp.where(mask, x, 0.0)


def _key_subchunk_decays(G: jax.Array, g: Rows, jb: int, S: int):
    """Factors at the last row r of key sub-chunk jb: e^{G_t − G_r} ≤ 1 for every row t after
    it (else 0) `[C, M]`, and e^{G_r − G_j} ≤ 1 for its rows j `[S, M]`."""
    ref = g(jb * S + S - 1, 1)
    query = exp(jnp.where(iota((G.shape[0], 1), 0) > jb * S + S - 1, G - ref, -jnp.inf))
    return query, exp(ref - g(jb * S, S))


def _query_subchunk_decays(G: jax.Array, g: Rows, ib: int, S: int):
    """Factors at the first row r of query sub-chunk ib: e^{G_t − G_r} ≤ 1 for its rows t
    `[S, M]`, and e^{G_r − G_n} ≤ 1 for every key row n before it (else 0) `[C, M]`."""
    ref = g(ib * S, 1)
    key = exp(jnp.where(iota((G.shape[0], 1), 0) < ib * S, ref - G, -jnp.inf))
    return exp(g(ib * S, S) - ref), key


def _diagonal_pieces(G: jax.Array, row: Callable[[jax.Array], jax.Array], S: int, body,
                     carry):
    """The pairs j ≤ t inside a sub-chunk (every sub-chunk of the chunk at once), in pieces
    whose factors stay within float32 range. When no sub-chunk decays by e^{−60} or more
    (`FAST_PATH_LIMIT`; strong gates usually), one piece: the pairs of each sub-chunk
    factorised at its last row m as e^{G_t − G_m}·e^{G_m − G_j} (query factors ≤ e^{60}, key
    factors ≤ 1). Otherwise by level, every factor ≤ 1: the pairs j = t, factors 1; then per
    level, blocks of b = 2, 4, …, S rows, the pairs with j in the left and t in the right half
    of a block, factorised at the left half's last row. Runs
    `carry = body(query, key, piece, carry)` for each piece: the query rows' factors `[C, M']`
    (0 outside the piece), the key rows' `[C, M']` and the pairs it takes `[C, C]` (symmetric:
    a form masks it to j ≤ t either way). `row(r)`: G's row r `[1, M']` (r traced). The levels
    and each level's midpoints are loops, not unrolled: the kernel then holds one level's
    values at a time (unrolled, 60 one-row loads at C 64 went live together and spilled:
    NOTES.md, session 25)."""
    C, top = G.shape[0], S.bit_length() - 1  # levels 0..top; level top + 1: one piece
    rows, t, j = iota((C, 1), 0), iota((C, C), 0), iota((C, C), 1)

    def level(l, carry):  # blocks of b = 2^l rows (b = 1: the pairs j = t), or the one piece
        whole = (l > top).astype(jnp.int32)
        size = jnp.left_shift(1, jnp.minimum(l, top))
        half = jnp.right_shift(size, 1)
        block = -size  # rows & block: the start of a row's block
        at = half - 1 + whole * (size - half)  # a block's factor row: its left half's last, or
                                               # (one piece) its last

        def factor_row_of(i, rows_G):  # block i's factor row to its rows
            start = size * i
            return jnp.where((rows & block) == start, row(start + at), rows_G)

        # (Products, not scalar `where`s: those lower wrongly to Triton: NOTES.md, session 25.)
        count = jnp.right_shift(C, jnp.minimum(l, top)) * jnp.minimum(l, 1)
        ref = lax.fori_loop(0, count, factor_row_of, G)  # b = 1: G itself, factors 1
        right = ((rows & half) != 0) | (l == 0) | (whole == 1)
        left = ((rows & half) == 0) | (l == 0) | (whole == 1)
        return body(exp(jnp.where(right, G - ref, -jnp.inf)),
                    exp(jnp.where(left, ref - G, -jnp.inf)), (t & block) == (j & block),
                    carry)

    def decay(i, least):  # the strongest decay over one sub-chunk so far `[1, 1]`
        return jnp.minimum(least, jnp.min(row(i * S + S - 1) - row(i * S), keepdims=True))

    least = lax.fori_loop(0, C // S, decay, jnp.zeros((1, 1), F32))
    one_piece = (jnp.min(least) >= -FAST_PATH_LIMIT).astype(jnp.int32)
    return lax.fori_loop(one_piece * (top + 1), top + 1 + one_piece, level, carry)


def _scores_piece(y: Rows, intra: Products, pairs, query, key, piece, outs) -> list:
    """The scores form's pieces (`_diagonal_pieces`): each of `pairs` (x·x'ᵀ `[C, C]`, masked
    to j ≤ t) weighs y over the piece's pairs, added to its `[C, M]` out in `outs`."""
    y_piece = y(0, pairs[0].shape[0]).astype(F32) * key
    return [out + query * intra.mm(jnp.where(piece, a, 0.0), y_piece)
            for out, a in zip(outs, pairs, strict=True)]


def _readout_piece(p: jax.Array, y: Rows, intra: Products, query, key, piece,
                   pairs) -> jax.Array:
    """The readout form's pair weights Σ_m p_tm e^{G_tm − G_jm} y_jm `[C, C]` of one piece
    (`_diagonal_pieces`), added to `pairs`."""
    C = p.shape[0]
    return pairs + jnp.where(piece, intra.mm_nt(p * query, y(0, C).astype(F32) * key), 0.0)


def slot_scores(pairs, y: Rows, g: Rows, *, S: int, state: Products, intra: Products,
                sigma: Segments | None = None, path: str = "both") -> list[jax.Array]:
    """The scores form for several `(x [C, X] value, x' Rows, state [X, M] f32)` that share y
    (s̄) and the gates (x, x' are inputs: q, k̄ or dO, v̄): one `[C, M]` float32 array per
    pair. `state` / `intra`: the products with the state / of the within-chunk pairs."""
    C = pairs[0][0].shape[0]
    entering = _entering(sigma, C)

    def fast():
        # Every tile is read before the first product: on the GPU these loads go through
        # registers (no loop to pipeline), and one read after a product waits out its latency
        # there (NOTES.md, "Where the kernels wait for their loads").
        keys = [x_keys(0, C) for _, x_keys, _ in pairs]
        G = g(0, C)
        y_inv = y(0, C).astype(F32) * exp(-G)
        pair_mask = _and(_causal(C), _same_segment(sigma, C, 0, C))
        return tuple(
            exp(G) * (_masked(state.mm(x, x_state, exact_a=True), entering)
                      + intra.mm(jnp.where(pair_mask, intra.mm_nt(x, x_keys, True, True), 0.0),
                                 y_inv))
            for (x, _, x_state), x_keys in zip(pairs, keys, strict=True))

    def exact():
        G = g(0, C)
        entry = exp(G)
        outs = [entry * _masked(state.mm(x, x_state, exact_a=True), entering)
                for x, _, x_state in pairs]
        for jb in range(C // S - 1):  # the key sub-chunks' pairs with the rows after them
            query, key = _key_subchunk_decays(G, g, jb, S)
            y_jb = y(jb * S, S).astype(F32) * key
            mask = _and(iota((C, S), 0) >= (jb + 1) * S, _same_segment(sigma, C, jb * S, S))
            for n, (x, x_keys, _) in enumerate(pairs):
                a = jnp.where(mask, intra.mm_nt(x, x_keys(jb * S, S), True, True), 0.0)
                outs[n] = outs[n] + query * intra.mm(a, y_jb)
        pair_mask = _and(_causal(C), _same_segment(sigma, C, 0, C))
        within = [jnp.where(pair_mask, intra.mm_nt(x, x_keys(0, C), True, True), 0.0)
                  for x, x_keys, _ in pairs]
        return tuple(_diagonal_pieces(G, lambda r: g(r, 1), S,
                                      functools.partial(_scores_piece, y, intra, within), outs))

    return list(_on_path(path, g, C, fast, exact))


def slot_readout(p: jax.Array, y: Rows, u: Rows, g: Rows, state_t: jax.Array, *, S: int,
                 state: Products, intra: Products, sigma: Segments | None = None,
                 path: str = "both") -> jax.Array:
    """The readout form: p `[C, M]` float32 weights of the slots, u the values `[C, Y]` (an
    input: v̄ or k̄) entering with s̄ = y, state_t `[Y, M]` float32 (Ṽᵀ or K̃). Returns
    `[C, Y]` float32."""
    C = p.shape[0]
    entering = _entering(sigma, C)

    def fast():
        values = u(0, C)  # read before the first product, as in `slot_scores`
        G = g(0, C)
        weights = p * exp(G)
        y_inv = y(0, C).astype(F32) * exp(-G)
        pairs = jnp.where(_and(_causal(C), _same_segment(sigma, C, 0, C)),
                          intra.mm_nt(weights, y_inv), 0.0)
        return (state.mm_nt(_masked(weights, entering), state_t)
                + intra.mm(pairs, values, exact_b=True))

    def exact():
        G = g(0, C)
        out = state.mm_nt(_masked(p * exp(G), entering), state_t)
        for jb in range(C // S - 1):  # as `slot_scores`'s exact path
            query, key = _key_subchunk_decays(G, g, jb, S)
            y_jb = y(jb * S, S).astype(F32) * key
            mask = _and(iota((C, S), 0) >= (jb + 1) * S, _same_segment(sigma, C, jb * S, S))
            w = jnp.where(mask, intra.mm_nt(p * query, y_jb), 0.0)
            out = out + intra.mm(w, u(jb * S, S), exact_b=True)
        w = _diagonal_pieces(G, lambda r: g(r, 1), S,
                             functools.partial(_readout_piece, p, y, intra), jnp.zeros((C, C), F32))
        w = jnp.where(_and(_causal(C), _same_segment(sigma, C, 0, C)), w, 0.0)
        return out + intra.mm(w, u(0, C), exact_b=True)

    return _on_path(path, g, C, fast, exact)


def slot_scores_tiled(pairs, y: Rows, g: Rows, *, S: int, tile: int, state: Products,
                      intra: Products, sigma: Segments | None = None,
                      path: str = "both") -> list[jax.Array]:
    """`slot_scores` with the features X in tiles of `tile`, one `fori_loop` step each, so that
    Triton's pipeliner loads a step's tiles with `cp.async` while the previous step's products
    run (the whole-chunk form takes every tile through registers first and spills at X 256:
    NOTES.md, session 18). Here x and x_state are refs and x' Rows take a column slice. The loop
    sums both products over X, the state part x·x_state `[C, M]` and the pairs x·x'ᵀ `[C, C]`;
    the fast or the exact path then weighs the pairs, reading no feature tile."""
    # x may be a pair of refs to the same array: (the state product's, the pairs'). On the
    # GPU one tile load feeding both products made Triton 3.6's pipeliner give the tile one
    # buffer fewer than the stages while the pairs' async wgmma still read it when the next
    # tile's cp.async overwrote it (NOTES.md, session 19); two loads keep the state product's
    # tile for registers only and give the pairs' its own buffers.
    pairs = [(x if isinstance(x, tuple) else (x, x), x_keys, x_state)
             for x, x_keys, x_state in pairs]
    C, X = pairs[0][0][0].shape

    def step(cols, sums):
        return [(part + state.mm(xs[:, cols], x_state[cols, :], exact_a=True),
                 pair + intra.mm_nt(xp[:, cols], x_keys(0, C, cols), True, True))
                for ((xs, xp), x_keys, x_state), (part, pair) in zip(pairs, sums, strict=True)]

    init = [(jnp.zeros((C, x_state.shape[1]), F32), jnp.zeros((C, C), F32))
            for _, _, x_state in pairs]
    sums = _feature_tiles(X, tile, step, init)
    entering = _entering(sigma, C)
    pair_mask = _and(_causal(C), _same_segment(sigma, C, 0, C))
    sums = [(_masked(part, entering), jnp.where(pair_mask, pair, 0.0)) for part, pair in sums]

    def fast():
        G = g(0, C)
        y_inv = y(0, C).astype(F32) * exp(-G)
        return tuple(exp(G) * (part + intra.mm(pair, y_inv)) for part, pair in sums)

    def exact():
        G, rows = g(0, C), iota((C, 1), 0)
        outs = [exp(G) * part for part, _ in sums]
        for jb in range(C // S - 1):
            query, key = _key_subchunk_factors(G, g, rows, jb, S)
            y_jb = y(0, C).astype(F32) * key
            outs = [out + query * intra.mm(pair, y_jb)
                    for out, (_, pair) in zip(outs, sums, strict=True)]
        pairs = [pair for _, pair in sums]
        return tuple(_diagonal_pieces(G, lambda r: g(r, 1), S,
                                      functools.partial(_scores_piece, y, intra, pairs), outs))

    return list(_on_path(path, g, C, fast, exact))


def slot_readout_tiled(p: jax.Array, y: Rows, u: Rows, g: Rows, state_t, store, *, S: int,
                       tile: int, state: Products, intra: Products,
                       sigma: Segments | None = None, path: str = "both") -> None:
    """`slot_readout` with the output features Y in tiles of `tile` (`slot_scores_tiled`'s
    reason): the pairs' weights `[C, C]` first (fast or exact path), then a `fori_loop` over the
    tiles of u (Rows taking a column slice) and state_t (a `[Y, M]` ref), handing each
    `[C, tile]` float32 part of the output to `store(cols, out)`."""
    C = p.shape[0]
    G = g(0, C)
    weights = p * exp(G)
    pair_mask = _and(_causal(C), _same_segment(sigma, C, 0, C))

    def fast():
        return intra.mm_nt(weights, y(0, C).astype(F32) * exp(-G))

    def exact():
        rows, pairs = iota((C, 1), 0), jnp.zeros((C, C), F32)
        for jb in range(C // S - 1):  # as `slot_scores_tiled`'s exact path
            query, key = _key_subchunk_factors(G, g, rows, jb, S)
            pairs += intra.mm_nt(p * query, y(0, C).astype(F32) * key)
        return _diagonal_pieces(G, lambda r: g(r, 1), S,
                                functools.partial(_readout_piece, p, y, intra), pairs)

    pairs = intra.operand(jnp.where(pair_mask, _on_path(path, g, C, fast, exact), 0.0))
    weights = state.operand(_masked(weights, _entering(sigma, C)))

    def step(cols, carry):
        store(cols, state.mm_nt(weights, state_t[cols, :])
              + intra.mm(pairs, u(0, C, cols), exact_b=True))
        return carry

    _feature_tiles(state_t.shape[0], tile, step, 0)


def _key_subchunk_factors(G: jax.Array, g: Rows, rows: jax.Array, jb: int, S: int):
    """`_key_subchunk_decays` with both factors over all C rows `[C, M]`: the key factors are 0
    outside key sub-chunk jb, so a full-width product adds only its pairs."""
    ref = g(jb * S + S - 1, 1)
    query = exp(jnp.where(rows > jb * S + S - 1, G - ref, -jnp.inf))
    inside = (rows >= jb * S) & (rows < (jb + 1) * S)
    return query, exp(jnp.where(inside, ref - G, -jnp.inf))


class InputSide(NamedTuple):
    """One half of the slot-input gradients: the keys (x = k̄, x_end = dK̃ after the chunk,
    per query head (q, dA), scale = the logits' scale) or the values (v̄, dṼᵀ, (dO, P), 1).
    x_in `[C, X]` and x_end `[X, M]` are values, or refs for `slot_input_grads_tiled`."""

    x_in: jax.Array
    x_end: jax.Array
    heads: list
    scale: float


def slot_input_grads(sides: list[InputSide], s_in: jax.Array, g: Rows, *, S: int,
                     intra: Products, gradient: Products, sigma: Segments | None = None,
                     path: str = "both"):
    """Gradients of one chunk's slot inputs: dx `[C, X]` of every side's input (k̄, v̄) and
    the sides' part of ds̄ `[C, M]` (ds̄ is the sum over both sides, so a kernel may compute
    one side and another kernel the other). s_in: s̄ `[C, M]` values; each head of a side is
    `(inputs, weights)` Rows of this chunk's query rows; `gradient`: the products of dx;
    `intra`: those of ds̄ (it feeds the log-gate gradient, a difference of nearly equal sums).
    Returns float32 `([dx per side], ds̄ part)`.
    """
    C = s_in.shape[0]
    G = g(0, C)
    exit_decay = _masked(exp(g(C - 1, 1) - G), exiting(sigma, C))  # write n at the end, ≤ 1
    written = s_in.astype(F32) * exit_decay
    dxs = [gradient.mm_nt(written, side.x_end) for side in sides]
    ds = exit_decay * sum(intra.mm(side.x_in, side.x_end, exact_a=True) for side in sides)
    # (Computing the within-chunk part first measured 1.4 ms slower on the H200: NOTES.md, v5.)
    options = dict(intra=intra, gradient=gradient, sigma=sigma)
    inside = _on_path(
        path, g, C,
        lambda: _input_grads_fast(sides, s_in, g, **options),
        lambda: _input_grads_subchunks(sides, s_in, g, S=S, **options))
    return [dx + part for dx, part in zip(dxs, inside[0], strict=True)], ds + inside[1]


def slot_input_grads_tiled(sides: list[InputSide], stores, s_in, g: Rows, finish, *, S: int,
                           tile: int, slot_tile: int, intra: Products, gradient: Products,
                           sigma: Segments | None = None, path: str = "both") -> None:
    """`slot_input_grads` with each side's features X in tiles of `tile`, one `fori_loop` step
    each: on the GPU, Triton's pipeliner then loads a step's tiles with `cp.async` while the
    previous step's products run, where the whole-chunk form takes every tile through
    registers first and spills (NOTES.md, v8). Here x_in and x_end are refs, the heads' Rows
    and g take a column slice too, and s_in(slots) loads those columns of s̄.

    Per side two loops: the sums over X that ds̄ needs, then dx tile by tile (the products of
    `slot_input_grads`), each tile handed to `stores[i](cols, dx)`. Between them the slots go
    in parts of `slot_tile` (fewer `[C, M]` float32 tiles live at once): each part's ds̄
    (float32; its sums over X accumulated tile by tile) goes to `finish(ds̄ part, s̄, slots)`,
    and the pulls of the query rows on the key rows add up as one `[C, C]` matrix per head
    (the exact path's sub-chunks fill its column blocks)."""
    C = sides[0].x_in.shape[0]
    options = dict(S=S, tile=tile, slot_tile=slot_tile, intra=intra, gradient=gradient,
                   sigma=sigma)
    # The branch holds the whole program (loops included): no value is live across it, so the
    # exact path's larger live set cannot push the fast path's values to local memory.
    _on_path(path, g, C,
             functools.partial(_tiled_grads, sides, stores, s_in, g, finish, True, **options),
             functools.partial(_tiled_grads, sides, stores, s_in, g, finish, False, **options))


def _tiled_grads(sides, stores, s_in, g: Rows, finish, fast: bool, *, S: int, tile: int,
                 slot_tile: int, intra: Products, gradient: Products, sigma) -> None:
    """`slot_input_grads_tiled` on the fast or the exact path."""
    C, M = sides[0].x_in.shape[0], sides[0].x_end.shape[1]
    parts = [slice(start, start + slot_tile) for start in range(0, M, slot_tile)]
    sums = [_feature_sums(side, tile, parts, intra) for side in sides]
    pair_mask = _and(iota((C, C), 0) <= iota((C, C), 1), _same_segment(sigma, C, 0, C))
    pulls, written = [0.0] * sum(len(side.heads) for side in sides), []
    for p, slots in enumerate(parts):
        G, s = g(0, C, slots), s_in(slots)
        within = functools.partial(_within_chunk, sides, [pairs for _, pairs in sums], s,
                                   slots, intra=intra, gradient=gradient)
        if fast:
            ds, part_pulls = within(exp(G), exp(-G), pair_mask)
        else:
            ds, part_pulls = _by_subchunks(within, g, G, slots, S, pair_mask, len(pulls))
        pulls = [a + b for a, b in zip(pulls, part_pulls, strict=True)]
        exit_decay = _masked(exp(g(C - 1, 1, slots) - G), exiting(sigma, C))
        finish(ds + exit_decay * sum(state_sums[p] for state_sums, _ in sums), s, slots)
        written.append(gradient.operand(s * exit_decay))
    pulls = iter([gradient.operand(pull) for pull in pulls])
    for side, store in zip(sides, stores, strict=True):
        _feature_grads(side, store, tile, parts, written, [next(pulls) for _ in side.heads],
                       gradient)


def _within_chunk(sides, pairs, s, slots, query, key, mask, *, intra: Products,
                  gradient: Products):
    """For the slots `slots`: ds̄'s within-chunk part `[C, part]`, and per head the pulls
    `[C, C]` of the query rows whose factors `query` `[C, part]` are not 0 (key: the key
    rows' factors; mask: the pairs taken) on the key rows."""
    C = s.shape[0]
    ds, pulls, s_key = 0.0, [], gradient.operand(s * key)
    for side, side_pairs in zip(sides, pairs, strict=True):
        for (_, weights), pair in zip(side.heads, side_pairs, strict=True):
            w = weights(0, C, slots) * query
            ds += key * intra.mm(jnp.where(mask, _scaled(side.scale, pair), 0.0), w)
            pulls.append(jnp.where(mask, gradient.mm_nt(s_key, w), 0.0))
    return ds, pulls


def _by_subchunks(within, g: Rows, G, slots, S: int, mask, num_pulls: int):
    """The exact path: the query rows by sub-chunks of S with the key rows before them, each
    factorised at its first row (`_input_grads_subchunks`), a loop; its query factors are 0
    outside it, so each step adds only its own columns of the pulls. Then the pairs inside the
    sub-chunks (`_diagonal_pieces`)."""
    C = G.shape[0]
    rows = iota((C, 1), 0)

    def sub_chunk(ib, carry):
        ref, start, end = g(ib * S, 1, slots), ib * S, (ib + 1) * S
        query = exp(jnp.where((rows >= start) & (rows < end), G - ref, -jnp.inf))
        key = exp(jnp.where(rows < start, ref - G, -jnp.inf))
        ds, pulls = within(query, key, mask)
        return carry[0] + ds, [a + b for a, b in zip(carry[1], pulls, strict=True)]

    zeros = [jnp.zeros((C, C), F32)] * num_pulls
    def piece_of(query, key, piece, carry):
        ds, pulls = within(query, key, mask & piece)
        return carry[0] + ds, [a + b for a, b in zip(carry[1], pulls, strict=True)]

    carry = lax.fori_loop(1, C // S, sub_chunk, (jnp.zeros_like(G), zeros))
    return _diagonal_pieces(G, lambda r: g(r, 1, slots), S, piece_of, carry)


def _feature_tiles(width: int, tile: int, step, init):
    """`carry = step(cols, carry)` over the tiles of `width` features (one tile when `tile`
    does not divide it), a `fori_loop`."""
    tile = tile if width % tile == 0 else width
    cols = lambda j: pl.ds(pl.multiple_of(j * tile, tile), tile)
    return lax.fori_loop(0, width // tile, lambda j, carry: step(cols(j), carry), init)


def _feature_sums(side: InputSide, tile: int, parts, intra: Products):
    """One side's sums over X: ds̄'s state part x_in·x_end `[C, part]` per slot part, and the
    within-chunk pairs x_in·inputsᵀ `[C, C]` per head."""

    def step(cols, carry):
        state_sums, pairs = carry
        x_in = side.x_in[:, cols]
        pairs = [pair + intra.mm_nt(x_in, inputs(0, C, cols), True, True)
                 for (inputs, _), pair in zip(side.heads, pairs, strict=True)]
        state_sums = [state_sum + intra.mm(x_in, side.x_end[cols, slots], exact_a=True)
                      for state_sum, slots in zip(state_sums, parts, strict=True)]
        return state_sums, pairs

    C = side.x_in.shape[0]
    init = ([jnp.zeros((C, slots.stop - slots.start), F32) for slots in parts],
            [jnp.zeros((C, C), F32) for _ in side.heads])
    return _feature_tiles(side.x_in.shape[1], tile, step, init)


def _feature_grads(side: InputSide, store, tile: int, parts, written, pulls,
                   gradient: Products):
    """One side's dx tile by tile: written·x_endᵀ (by slot parts) + Σ_heads pull·inputs."""
    C = pulls[0].shape[0]

    def step(cols, carry):
        dx = 0.0
        for part, slots in zip(written, parts, strict=True):
            dx += gradient.mm_nt(part, side.x_end[cols, slots])
        for (inputs, _), pull in zip(side.heads, pulls, strict=True):
            dx += _scaled(side.scale, gradient.mm(pull, inputs(0, C, cols), exact_b=True))
        store(cols, dx)
        return carry

    _feature_tiles(side.x_in.shape[1], tile, step, 0)


def _input_grads_fast(sides, s_in, g: Rows, *, intra: Products, gradient: Products, sigma):
    C = s_in.shape[0]
    G = g(0, C)
    mask = _and(iota((C, C), 0) <= iota((C, C), 1), _same_segment(sigma, C, 0, C))
    dxs, inner = _query_rows_pull(sides, s_in.astype(F32) * exp(-G), 0, C, exp(G),
                                  mask, intra=intra, gradient=gradient)
    return tuple(dxs), exp(-G) * inner


def _input_grads_subchunks(sides, s_in, g: Rows, *, S: int, intra: Products,
                           gradient: Products, sigma):
    C = s_in.shape[0]
    G = g(0, C)
    dxs, ds = [0.0] * len(sides), 0.0
    for ib in range(1, C // S):  # the query sub-chunks' pairs with the key rows before them
        query, key = _query_subchunk_decays(G, g, ib, S)
        mask = _and(iota((C, S), 0) < ib * S, _same_segment(sigma, C, ib * S, S))
        pull, inner = _query_rows_pull(sides, s_in.astype(F32) * key, ib * S, S, query, mask,
                                       intra=intra, gradient=gradient)
        dxs, ds = [a + b for a, b in zip(dxs, pull, strict=True)], ds + key * inner
    # The pairs inside the sub-chunks: each head's pulls `[C, C]` add up over the pieces and
    # meet its inputs once, after the loop (dx is linear in them).
    pair_mask = _and(iota((C, C), 0) <= iota((C, C), 1), _same_segment(sigma, C, 0, C))
    heads = [(i, side, side.heads[r]) for r in range(len(sides[0].heads))
             for i, side in enumerate(sides)]

    def piece_of(query, key, piece, carry):
        pulls, ds = carry
        s_key, mask, inner = s_in.astype(F32) * key, pair_mask & piece, 0.0
        added = []
        for pull, (_, side, (inputs, weights)) in zip(pulls, heads, strict=True):
            w = weights(0, C) * query
            added.append(pull + jnp.where(mask, gradient.mm_nt(s_key, w), 0.0))
            pairs = intra.mm_nt(side.x_in, inputs(0, C), True, True)
            inner += intra.mm(jnp.where(mask, _scaled(side.scale, pairs), 0.0), w)
        return added, ds + key * inner

    pulls, ds = _diagonal_pieces(G, lambda r: g(r, 1), S, piece_of,
                                 ([jnp.zeros((C, C), F32)] * len(heads), ds + jnp.zeros_like(G)))
    for (i, side, (inputs, _)), pull in zip(heads, pulls, strict=True):
        dxs[i] = dxs[i] + _scaled(side.scale, gradient.mm(pull, inputs(0, C), exact_b=True))
    return tuple(dxs), ds


def _query_rows_pull(sides, s_key, start: int, size: int, query, mask, *, intra: Products,
                     gradient: Products):
    """What query rows start..start+size−1 contribute to the gradients of every key row n:
    each side's dx and the inner sum of ds̄ (before its key-side decay). s_key: s̄ with the
    key-side decay factors; query `[size, M]`: the query-side ones; mask `[C, size]`: key row
    n ≤ query row t, same document."""
    dxs, inner = [0.0] * len(sides), 0.0
    for r in range(len(sides[0].heads)):
        for i, side in enumerate(sides):
            inputs, weights = side.heads[r]
            in_rows, w_rows = inputs(start, size), weights(start, size) * query
            dxs[i] += _scaled(side.scale, gradient.mm(
                jnp.where(mask, gradient.mm_nt(s_key, w_rows), 0.0), in_rows, exact_b=True))
            pairs = jnp.where(mask, _scaled(side.scale,
                                            intra.mm_nt(side.x_in, in_rows, True, True)), 0.0)
            inner += intra.mm(pairs, w_rows)
    return dxs, inner


def _scaled(scale: float, x: jax.Array) -> jax.Array:
    return x if scale == 1.0 else scale * x
