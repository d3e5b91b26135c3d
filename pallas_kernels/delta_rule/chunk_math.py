"""In-kernel math of one chunk shared by the gated delta rule kernels (values, not refs).

Local rows 0..C−1 of one head. Γ_t = Σ_{l≤t} g_l is the cumulative log decay from the chunk
start (inclusive). With document starts, n_t = Σ_{l≤t} start_l counts the documents begun in
the chunk up to row t: a pair (t, j) interacts only if n_t = n_j, the state entering the chunk
reaches row t only if n_t = 0, and survives the chunk only if no document starts in it. Every
exponent is masked before `exp`, so no masked pair can overflow.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


def iota(shape: tuple[int, ...], axis: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def total(x: jax.Array) -> jax.Array:
    """Sum of a 1-D or 2-D array (the Triton lowering reduces one axis at a time)."""
    return jnp.sum(jnp.sum(x, axis=-1), axis=0) if x.ndim == 2 else jnp.sum(x, axis=0)


def reverse_cumsum(x: jax.Array) -> jax.Array:
    """Σ_{t' ≥ t} x_t' of a 1-D array (the Triton lowering has no reverse cumsum)."""
    return jnp.sum(x) - jnp.cumsum(x) + x


def _masked_exp(x: jax.Array, keep: jax.Array | None) -> jax.Array:
    """e^x where `keep` (None: everywhere), else 0."""
    if keep is None:
        return jnp.exp(x)
    return jnp.where(keep, jnp.exp(jnp.where(keep, x, 0.0)), 0.0)


@dataclasses.dataclass(frozen=True)
class Rows:
    """Rows start..start+n−1 of a chunk: their cumulative log decay Γ `[n]` and document
    counter n `[n]` (None without documents)."""

    start: int
    log_decay: jax.Array
    docs: jax.Array | None


def decay_matrix(rows: Rows, cols: Rows, *, strict: bool) -> jax.Array:
    """`[n_rows, n_cols]`: e^{Γ_t − Γ_j} for column j before (strict) or at row t in the same
    document, else 0."""
    shape = (rows.log_decay.shape[0], cols.log_decay.shape[0])
    row, col = rows.start + iota(shape, 0), cols.start + iota(shape, 1)
    mask = row > col if strict else row >= col
    if rows.docs is not None:
        mask &= rows.docs[:, None] == cols.docs[None, :]
    return _masked_exp(rows.log_decay[:, None] - cols.log_decay[None, :], mask)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Decay factors of one whole chunk, float32.

    rows: Γ and the document counter of every row. entry `[C]`: e^{Γ_t}, what is left at row t
    of the state entering the chunk. to_end `[C]`: e^{Γ_last − Γ_t}, what is left at the chunk
    end of a write at row t. decay (scalar): e^{Γ_last}, the entering state's decay over the
    chunk.
    """

    rows: Rows
    entry: jax.Array
    to_end: jax.Array
    decay: jax.Array

    def pairs(self) -> jax.Array:
        """`[C, C]` pair decays e^{Γ_t − Γ_j}, j ≤ t in the same document, else 0."""
        return decay_matrix(self.rows, self.rows, strict=False)


def entry_decay(rows: Rows) -> jax.Array:
    """e^{Γ_t} for rows in the chunk's first document (the entering state's share), else 0."""
    return _masked_exp(rows.log_decay, None if rows.docs is None else rows.docs == 0)


def chunk_decays(g: jax.Array, starts: jax.Array | None) -> Chunk:
    """The `Chunk` of log decays g `[C]` (float32) and document starts `[C]` (1.0 where a
    document starts, or None)."""
    log_decay = jnp.cumsum(g)
    last = jnp.sum(g)
    rows = Rows(0, log_decay, None if starts is None else jnp.cumsum(starts))
    docs_last = None if starts is None else jnp.sum(starts)
    return Chunk(
        rows, entry_decay(rows),
        _masked_exp(last - log_decay, None if starts is None else rows.docs == docs_last),
        _masked_exp(last, None if starts is None else docs_last == 0))


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """(I + a)⁻¹ of a strictly lower triangular float32 `[n, n]` (n small): forward substitution
    in registers, row r of the inverse = e_r − Σ_{j<r} a_rj · (row j), exact in float32."""
    n = a.shape[0]
    rows, cols = iota((n, n), 0), iota((n, n), 1)
    inverse = (rows == cols).astype(F32)
    a_t = a.T  # column r of aᵀ is row r of a, laid out down the rows j
    for r in range(1, n):
        a_r = jnp.sum(jnp.where(cols == r, a_t, 0.0), axis=1, keepdims=True)  # [n, 1]: a_rj
        # Row r is still e_r, and a_rj = 0 for j ≥ r: only the finished rows j < r count.
        row_r = inverse - jnp.sum(a_r * inverse, axis=0, keepdims=True)
        inverse = jnp.where(rows == r, row_r, inverse)
    return inverse


def block_lower_inverse(blocks: dict[tuple[int, int], jax.Array], count: int
                        ) -> dict[tuple[int, int], jax.Array]:
    """T = (I + A)⁻¹ of a strictly lower triangular A given as `count` × `count` square blocks
    `blocks[i, j]` (j ≤ i; the diagonal ones strictly lower): the blocks T_ij (j ≤ i) by
    T_ii = (I + A_ii)⁻¹ and T_ij = −T_ii Σ_{j ≤ m < i} A_im T_mj, float32 products at full
    precision (they are small; the inverse feeds every correction)."""
    exact = lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                         precision=lax.Precision.HIGHEST,
                                         preferred_element_type=F32)
    inverse = {}
    for i in range(count):
        inverse[i, i] = unit_lower_inverse(blocks[i, i])
        for j in range(i - 1, -1, -1):
            below = sum(exact(blocks[i, m], inverse[m, j]) for m in range(j, i))
            inverse[i, j] = -exact(inverse[i, i], below)
    return inverse
