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

from pallas_kernels.base2 import exp
from pallas_kernels.matmul import mm

F32 = jnp.float32


def iota(shape: tuple[int, ...], axis: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def total(x: jax.Array) -> jax.Array:
    """Sum of a 1-D or 2-D array (the Triton lowering reduces one axis at a time)."""
    return jnp.sum(jnp.sum(x, axis=-1), axis=0) if x.ndim == 2 else jnp.sum(x, axis=0)


def reverse_cumsum(x: jax.Array) -> jax.Array:
    """Σ_{t' ≥ t} x_t' of a 1-D array (the Triton lowering has no reverse cumsum)."""
    return jnp.sum(x) - jnp.cumsum(x) + x


def masked_exp(x: jax.Array, keep: jax.Array | None) -> jax.Array:
    """e^x where `keep` (None: everywhere), else 0: e^{−inf}, masked before `exp` (one select,
    no overflow)."""
    return exp(x if keep is None else jnp.where(keep, x, -jnp.inf))


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Decay factors of one chunk, float32.

    log_decay `[C]`: Γ. docs `[C]`: the document counter n (None without documents). entry
    `[C]`: e^{Γ_t}, what is left at row t of the state entering the chunk. to_end `[C]`:
    e^{Γ_last − Γ_t}, what is left at the chunk end of a write at row t. decay (scalar):
    e^{Γ_last}, the entering state's decay over the chunk.
    """

    log_decay: jax.Array
    docs: jax.Array | None
    entry: jax.Array
    to_end: jax.Array
    decay: jax.Array

    def pairs(self, *, strict: bool = False, transposed: bool = False) -> jax.Array:
        """`[C, C]` pair decays D_tj = e^{Γ_t − Γ_j} for j ≤ t (j < t if `strict`) in the same
        document, else 0; Dᵀ if `transposed` (computed as such, in the same register layout)."""
        n = self.log_decay.shape[0]
        later, earlier = iota((n, n), 0), iota((n, n), 1)
        log_later, log_earlier = self.log_decay[:, None], self.log_decay[None, :]
        if transposed:
            later, earlier, log_later, log_earlier = earlier, later, log_earlier, log_later
        mask = later > earlier if strict else later >= earlier
        if self.docs is not None:
            mask &= self.docs[:, None] == self.docs[None, :]
        return masked_exp(log_later - log_earlier, mask)


def chunk_decays(g: jax.Array, starts: jax.Array | None) -> Chunk:
    """The `Chunk` of log decays g `[C]` (float32) and document starts `[C]` (1.0 where a
    document starts, or None)."""
    return cumulative_decays(jnp.cumsum(g), jnp.sum(g),
                             None if starts is None else jnp.cumsum(starts),
                             None if starts is None else jnp.sum(starts))


def cumulative_decays(log_decay: jax.Array, last: jax.Array, docs: jax.Array | None,
                      docs_last: jax.Array | None) -> Chunk:
    """The `Chunk` of Γ `[C]` and Γ_last, and of the document counter n `[C]` and n_last (or
    None): no scan (the sequential kernels read them precomputed, `layout.load_decays`)."""
    return Chunk(
        log_decay, docs, masked_exp(log_decay, None if docs is None else docs == 0),
        masked_exp(last - log_decay, None if docs is None else docs == docs_last),
        masked_exp(last, None if docs is None else docs_last == 0))


def split_products(a: jax.Array, b: jax.Array, op) -> jax.Array:
    """a @ b of float32 `a` and `b` to about float32 accuracy: exact (HIGHEST) when the operand
    dtype `op` is float32, else three bf16 tensor-core products of hi/lo splits
    (a_hi b_hi + a_hi b_lo + a_lo b_hi, relative error ≈ 2⁻¹⁶)."""
    if op == F32:
        return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=lax.Precision.HIGHEST,
                               preferred_element_type=F32)
    a_hi, b_hi = a.astype(op), b.astype(op)
    a_lo, b_lo = (a - a_hi.astype(F32)).astype(op), (b - b_hi.astype(F32)).astype(op)
    return mm(a_hi, b_hi) + (mm(a_hi, b_lo) + mm(a_lo, b_hi))


def split_rows(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b of a float32 `a` and `b` in the operand dtype, to about float32 accuracy: `b` as
    it is, `a` split into two (a_hi b + a_lo b) when `b` is bf16."""
    if b.dtype == F32:
        return mm(a, b)
    a_hi = a.astype(b.dtype)
    return mm(a_hi, b) + mm((a - a_hi.astype(F32)).astype(b.dtype), b)


def lower_inverse(a: jax.Array, a_t: jax.Array | None, size: int, op, *,
                  single: bool = False) -> jax.Array:
    """T = (I + a)⁻¹ of a strictly lower triangular float32 `[n, n]`, in registers.

    The diagonal blocks of `size` rows first, all at once, by forward substitution in float32
    (exact: row r of a block's inverse is e_r − Σ_{j<r} a_rj · (row j)): on the whole tile
    from aᵀ when the caller gives `a_t` (computed as such, in the same register layout), else
    block by block from `a` (`_diagonal_inverses_by_block`). Then blocks of size b are merged
    pairwise into blocks of 2b, b = size, 2·size, …: with T block diagonal and a_b the
    lower-left b × b block of each 2b one, T ← T − T (a_b T) (T₂₁ = −T₂₂ a₂₁ T₁₁), by
    `split_products` (`single`: by one float32 product each, `merge_diagonal_blocks`).
    """
    n = a.shape[0]
    rows, cols = iota((n, n), 0), iota((n, n), 1)
    block = lambda x, b: x // b
    t = (_diagonal_inverses_by_block(a, size) if a_t is None
         else _diagonal_inverses_whole(a_t, size))
    lower_left = lambda b: ((block(rows, 2 * b) == block(cols, 2 * b))
                            & (block(rows, b) % 2 == 1) & (block(cols, b) % 2 == 0))
    return merge_diagonal_blocks(a, t, size, op, lower_left, single=single)


def merge_diagonal_blocks(a: jax.Array, t: jax.Array, size: int, op, lower_left, *,
                          single: bool = False) -> jax.Array:
    """(I + a)⁻¹ from `t`, the inverses of its diagonal blocks of `size` rows (zero elsewhere),
    by `lower_inverse`'s pairwise merges (`split_products` in the operand dtype `op`);
    `lower_left(b)`: the `[n, n]` mask of the lower-left b × b block of every diagonal 2b × 2b
    block (the caller's integer arithmetic: Mosaic lowers `//` and `%` through `sign`, which
    needs the chip, so the TPU kernels make it from bit operations). `single`: each product
    one float32 `mm` of the float32 tiles instead (TF32 on the GPU's tensor cores, ≈ 2⁻¹¹
    relative error; exact in interpret mode): a third of the tensor-core work and none of
    the hi/lo splits (`BlockSizes.tf32_merges`, NOTES.md Round 18)."""
    product = mm if single else (lambda x, y: split_products(x, y, op))
    b = size
    while b < a.shape[0]:
        t = t - product(t, product(jnp.where(lower_left(b), a, 0.0), t))
        b *= 2
    return t


def _diagonal_inverses_whole(a_t: jax.Array, size: int) -> jax.Array:
    """The diagonal blocks of (I + a)⁻¹ (zero elsewhere), `[n, n]`, on the whole tile from aᵀ.

    Carried transposed, with the coefficients of step r a column of aᵀ, so that both sums of
    a step run along axis 1 (within a warp; rows are spread over warps); the coefficients
    still reach axis 1 through shared memory (a layout conversion and two barriers a step)."""
    n = a_t.shape[0]
    rows, cols = iota((n, n), 0), iota((n, n), 1)
    eye = (rows == cols).astype(F32)
    same = rows // size == cols // size
    step_col = cols % size
    # Tᵀ of the diagonal blocks (column j final once local index j is done), made from a_t so
    # that Triton gives it a_t's register layout (the dot's: a row's values within one warp).
    x = eye + 0.0 * a_t
    for r in range(1, size):
        # a_r[j] = a[size·⌊j/size⌋ + r, j], row r of each diagonal block = column r of aᵀ.
        a_r = jnp.sum(jnp.where((step_col == r) & same, a_t, 0.0), axis=1)
        done = jnp.sum(x * a_r[None, :], axis=1, keepdims=True)  # [n, 1]: Σ_j T[j, c] a[t, j]
        x = jnp.where((step_col == r) & same, eye - done, x)
    return x.T


def _diagonal_inverses_by_block(a: jax.Array, size: int) -> jax.Array:
    """The diagonal blocks of (I + a)⁻¹ (zero elsewhere), `[n, n]`, block by block.

    The tile is viewed as `[n / size, size, n / size, size]` (row block, row in block, column
    block, column in block) and its diagonal blocks taken out as `[n / size, size, size]`: in
    the dot layout at 4 warps each 16-row block lives in one warp, so the reshapes move
    nothing and every sum below stays within a warp (no shared memory, no barrier a step).
    Carried transposed, y[b, c, i] = T[b·s + i, b·s + c]: column r of y is
    e_r − Σ_{j<r} a[b·s + r, b·s + j] · (column j of y), with the coefficients row r of the
    block; one transpose at the end."""
    n = a.shape[0]
    nb = n // size
    a4 = a.reshape(nb, size, nb, size)  # a4[b, i, d, j] = a[b·s + i, d·s + j]
    diagonal = iota(a4.shape, 0) == iota(a4.shape, 2)
    blocks = jnp.sum(jnp.where(diagonal, a4, 0.0), axis=2)  # [nb, s, s]: a's diagonal blocks
    row, col = iota(blocks.shape, 1), iota(blocks.shape, 2)
    eye = (row == col).astype(F32)
    y = eye + 0.0 * blocks  # in the blocks' register layout
    for r in range(1, size):
        coef = jnp.sum(jnp.where(row == r, blocks, 0.0), axis=1, keepdims=True)  # [nb, 1, s]
        done = jnp.sum(coef * y, axis=2, keepdims=True)  # [nb, s, 1]
        y = jnp.where(col == r, eye - done, y)
    t_blocks = jnp.swapaxes(y, 1, 2)
    return jnp.where(diagonal, t_blocks[:, :, None, :], 0.0).reshape(n, n)
