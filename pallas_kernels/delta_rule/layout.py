"""Where the gated delta rule kernels' arrays live (layout in `forward.py`): block specs, the
kernels' ref lists with the optional document starts, and the sequential kernels' chunk loads
and loop, written once for the two kinds of kernel:

  per chunk   grid (batch, head, chunk): one chunk of rows, the chunk's state
  per K tile  grid (batch, head, chunk × K tile): as per chunk, one K tile of q, k and the state
  per V tile  grid (batch, head, chunk × V tile): as per chunk, one V tile of u, o and the state
  sequential  grid (batch, head, V tile): whole sequences, one loop over chunks inside
"""

from __future__ import annotations

from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.delta_rule.chunk_math import Chunk, cumulative_decays


class ChunkSpecs:
    """Specs of a per-chunk kernel, chunk C; `group` value heads share a key head (the
    `shared_*` specs: head h reads head h // group of the key-side arrays q, k, g, β, W, P,
    T)."""

    def __init__(self, chunk: int, group: int = 1):
        self.C, self.group = chunk, group

    def rows(self, dim: int) -> pl.BlockSpec:
        """This chunk's rows of a `[B, Tp, H, dim]` array."""
        return pl.BlockSpec((None, self.C, None, dim), lambda b, h, c: (b, c, h, 0))

    def shared_rows(self, dim: int) -> pl.BlockSpec:
        """This chunk's rows of a `[B, Tp, H / group, dim]` array (q, k, W, P, T)."""
        n = self.group
        return pl.BlockSpec((None, self.C, None, dim), lambda b, h, c: (b, c, h // n, 0))

    def steps(self) -> pl.BlockSpec:
        """This chunk of a `[B, H, Tp]` array (g, β)."""
        return pl.BlockSpec((None, None, self.C), lambda b, h, c: (b, h, c))

    def shared_steps(self) -> pl.BlockSpec:
        """This chunk of a `[B, H / group, Tp]` array (g, β)."""
        n = self.group
        return pl.BlockSpec((None, None, self.C), lambda b, h, c: (b, h // n, c))

    def starts(self) -> pl.BlockSpec:
        """This chunk of the `[B, Tp]` document starts."""
        return pl.BlockSpec((None, self.C), lambda b, h, c: (b, c))

    def state(self, key_dim: int, value_dim: int) -> pl.BlockSpec:
        """The state of this chunk in a `[B, H, NC·K, V]` array of per-chunk states."""
        return pl.BlockSpec((None, None, key_dim, value_dim), lambda b, h, c: (b, h, c, 0))


class KeyTileSpecs:
    """Specs of a per-(chunk, K tile) kernel, chunk C, `tiles` K tiles: grid (batch, head,
    chunk · tiles + K tile), the K tiles of one chunk next to each other (they read the same
    rows of dO, U, dU, T: neighbours in time share them through L2)."""

    def __init__(self, chunk: int, tiles: int, group: int = 1):
        self.C, self.tiles, self.group = chunk, tiles, group

    def rows(self, dim: int) -> pl.BlockSpec:
        """This chunk's rows of a `[B, Tp, H, dim]` array."""
        n = self.tiles
        return pl.BlockSpec((None, self.C, None, dim), lambda b, h, p: (b, p // n, h, 0))

    def shared_rows(self, dim: int) -> pl.BlockSpec:
        """As `rows`, of a `[B, Tp, H / group, dim]` array (q, k, W, P, T)."""
        n, group = self.tiles, self.group
        return pl.BlockSpec((None, self.C, None, dim), lambda b, h, p: (b, p // n, h // group, 0))

    def key_rows(self, key_tile: int) -> pl.BlockSpec:
        """This chunk's rows, this K tile's columns of a `[B, Tp, H, K]` array."""
        n = self.tiles
        return pl.BlockSpec((None, self.C, None, key_tile), lambda b, h, p: (b, p // n, h, p % n))

    def shared_key_rows(self, key_tile: int) -> pl.BlockSpec:
        """As `key_rows`, of a `[B, Tp, H / group, K]` array (q, k)."""
        n, group = self.tiles, self.group
        return pl.BlockSpec((None, self.C, None, key_tile),
                            lambda b, h, p: (b, p // n, h // group, p % n))

    def steps(self) -> pl.BlockSpec:
        n = self.tiles
        return pl.BlockSpec((None, None, self.C), lambda b, h, p: (b, h, p // n))

    def shared_steps(self) -> pl.BlockSpec:
        n, group = self.tiles, self.group
        return pl.BlockSpec((None, None, self.C), lambda b, h, p: (b, h // group, p // n))

    def starts(self) -> pl.BlockSpec:
        n = self.tiles
        return pl.BlockSpec((None, self.C), lambda b, h, p: (b, p // n))

    def state(self, key_tile: int, value_dim: int) -> pl.BlockSpec:
        """This K tile's rows of this chunk's state in a `[B, H, NC·K, V]` array (block
        c · tiles + K tile)."""
        return pl.BlockSpec((None, None, key_tile, value_dim), lambda b, h, p: (b, h, p, 0))

    def partial(self) -> pl.BlockSpec:
        """This chunk of this K tile's row of a `[B, H, tiles, Tp]` array of partial sums."""
        n = self.tiles
        return pl.BlockSpec((None, None, None, self.C), lambda b, h, p: (b, h, p % n, p // n))


class ValueTileSpecs(KeyTileSpecs):
    """Specs of a per-(chunk, V tile) kernel: as `KeyTileSpecs`, the tiles along V."""

    def value_rows(self, value_tile: int) -> pl.BlockSpec:
        """This chunk's rows, this V tile's columns of a `[B, Tp, H, V]` array."""
        return self.key_rows(value_tile)

    def state(self, key_dim: int, value_tile: int) -> pl.BlockSpec:
        """This V tile of this chunk's state in a `[B, H, NC·K, V]` array."""
        n = self.tiles
        return pl.BlockSpec((None, None, key_dim, value_tile),
                            lambda b, h, p: (b, h, p // n, p % n))


class SequentialSpecs:
    """Specs of a sequential kernel over `length` padded steps, V tile `tile`."""

    def __init__(self, length: int, tile: int, group: int = 1):
        self.length, self.tile, self.group = length, tile, group

    def whole(self, dim: int) -> pl.BlockSpec:
        """The whole sequence of one head of a `[B, Tp, H, dim]` array."""
        return pl.BlockSpec((None, self.length, None, dim), lambda b, h, j: (b, 0, h, 0))

    def shared_whole(self, dim: int) -> pl.BlockSpec:
        """The whole sequence of key head h // group of a `[B, Tp, H / group, dim]` array."""
        n = self.group
        return pl.BlockSpec((None, self.length, None, dim), lambda b, h, j: (b, 0, h // n, 0))

    def tiled(self) -> pl.BlockSpec:
        """The whole sequence of this V tile of a `[B, Tp, H, V]` array."""
        return pl.BlockSpec((None, self.length, None, self.tile), lambda b, h, j: (b, 0, h, j))

    def steps(self) -> pl.BlockSpec:
        return pl.BlockSpec((None, None, self.length), lambda b, h, j: (b, h, 0))

    def shared_steps(self) -> pl.BlockSpec:
        n = self.group
        return pl.BlockSpec((None, None, self.length), lambda b, h, j: (b, h // n, 0))

    def starts(self) -> pl.BlockSpec:
        return pl.BlockSpec((None, self.length), lambda b, h, j: (b, 0))

    def state(self, rows: int) -> pl.BlockSpec:
        """This V tile of a `[B, H, rows, V]` state array (one state, or NC·K rows of them)."""
        return pl.BlockSpec((None, None, rows, self.tile), lambda b, h, j: (b, h, 0, j))


def with_starts(in_specs: list, args: list, starts_spec: pl.BlockSpec, starts, documents: bool):
    """Appends the document starts (spec and array) when the call has documents."""
    if documents:
        in_specs.append(starts_spec)
        args.append(starts)
    return in_specs, args


def split_refs(refs, count: int, documents: bool):
    """(the first `count` refs, the starts ref or None, the remaining refs) of a kernel whose
    inputs are `count` arrays, the optional starts, then the rest."""
    starts_ref = refs[count] if documents else None
    return refs[:count], starts_ref, refs[count + documents:]


def chunk_loop(num_chunks: int, load, step, carry, *, reverse: bool):
    """`carry = step(c, carry, load(c))` for every chunk c, in time order or reversed. `load(c)`
    reads chunk c's tiles; no address depends on the carry, so Triton's pipeliner
    (num_stages) issues the loads ahead of the math. (Loading the next chunk's tiles
    explicitly, carried through the loop, measured slower in sessions 3 and 11 and was
    removed: NOTES.md.)"""
    order = (lambda i: num_chunks - 1 - i) if reverse else (lambda i: i)
    return lax.fori_loop(0, num_chunks, lambda i, s: step(order(i), s, load(order(i))), carry)


def load_decays(log_decay_ref, docs_ref, c, C: int) -> Chunk:
    """Chunk c's `Chunk` from the `[Tp]` refs of Γ and of n (None without documents) that
    `chunk_sums.chunk_cumsum` made: their rows and their values at the chunk's last row."""
    span, last = pl.ds(c * C, C), c * C + C - 1
    docs, docs_last = (None, None) if docs_ref is None else (docs_ref[span], docs_ref[last])
    return cumulative_decays(log_decay_ref[span], log_decay_ref[last], docs, docs_last)

