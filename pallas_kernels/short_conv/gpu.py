"""Short-convolution kernels for NVIDIA GPUs: Pallas with the Triton lowering (testable in
interpret mode on CPU).

Layout `[batch, time, channels]`, `K = size` taps. Every ref is the whole array in global
memory; a program reads its tile at time offsets `t + d` directly (masked loads: zeros before
the row's start, after its end and past the last channel), so nothing is padded or copied in
XLA and the shifted reads of neighbouring offsets hit the L1/L2 caches.

- forward, per (time tile, channel tile, batch row): z_t = b + Σ_i w_i ⊙ x_{t−i} with the
  taps of another document masked out of the load, y = act(z).
- backward, per (run of time steps, channel tile, batch row), one time step (a row of
  channels) a loop step: g_t = dy_t ⊙ act'(z_t) with z_t formed from x_t and the K − 1 steps
  before, which are carried in registers with their ids and g (nothing but the inputs is
  saved, so z is recomputed, once a step), dx_s = Σ_j w_j ⊙ g_{s+j} [same document] written
  at step s + K − 1, and the partial sums dw_i = Σ_t g_t ⊙ x_{t−i} [same document],
  db = Σ_t g_t of the run kept as rows over the loop (summed over the runs and the batch in
  XLA). Without an activation g = dy and no z is formed.

Streaming rows replaced a tile form (session 15; NOTES.md "Streaming backward"): Triton cannot
shift a register tile by a row, so that form recomputed z and g at the K offsets from shifted
loads (K² multiply-adds and K sigmoids per element, ≈ 137 SASS instructions an element
against ≈ 38): 2.5–2.9× slower on the H200.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.call import pallas_call, triton_params
from pallas_kernels.gpu_elementwise import iota, sigmoid
from pallas_kernels.short_conv.block_sizes import BlockSizes

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Static:
    """The static configuration of one call."""

    size: int
    activation: bool
    bias: bool
    documents: bool
    blocks: BlockSizes
    interpret: bool


def _silu_grad(z):
    """d/dz (z·σ(z)) = σ(z)·(1 + z·(1 − σ(z)))."""
    s = sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


@dataclasses.dataclass(frozen=True)
class _Tile:
    """Time steps `rows` `[BT, 1]` and channels `cols` `[1, BC]` of batch row `b`, read at time
    offsets `d` (rows + d)."""

    b: jax.Array
    rows: jax.Array
    cols: jax.Array
    length: int
    channels: int

    def inside(self, d: int) -> jax.Array:
        """`[BT, 1]`: rows + d is a time step of the row."""
        r = self.rows + d
        return (r >= 0) & (r < self.length)

    def read(self, ref, d: int, where: jax.Array | None = None) -> jax.Array:
        """`ref[b, rows + d, cols]` in float32, zero outside the array and where `where`
        (`[BT, 1]`) is False."""
        mask = self.inside(d) & (self.cols < self.channels)
        if where is not None:
            mask = mask & where
        return pltriton.load(ref.at[self.b, self.rows + d, self.cols], mask=mask,
                             other=0).astype(F32)

    def ids(self, ref, d: int) -> jax.Array:
        """Segment ids `[BT, 1]` at rows + d (−1 outside the row: only ever compared where the
        input or the cotangent read there is zero anyway)."""
        return pltriton.load(ref.at[self.b, self.rows + d], mask=self.inside(d), other=-1)

    def write(self, ref, value: jax.Array) -> None:
        mask = self.inside(0) & (self.cols < self.channels)
        pltriton.store(ref.at[self.b, self.rows, self.cols], value.astype(ref.dtype), mask=mask)


def _taps(w_ref, cols, channels: int, size: int) -> list[jax.Array]:
    """The K weight rows `[1, BC]` float32 (zero past the last channel)."""
    inside = cols < channels
    return [pltriton.load(w_ref.at[i, cols], mask=inside, other=0).astype(F32)
            for i in range(size)]


def _bias(b_ref, cols, channels: int) -> jax.Array:
    return pltriton.load(b_ref.at[cols], mask=cols < channels, other=0).astype(F32)


def _unpack(refs, st: Static, outputs: int):
    """x, w, bias (or None), ids (or None), the other inputs, the outputs."""
    refs = list(refs)
    x_ref, w_ref = refs.pop(0), refs.pop(0)
    b_ref = refs.pop(0) if st.bias else None
    seg_ref = refs.pop(0) if st.documents else None
    return x_ref, w_ref, b_ref, seg_ref, refs[:-outputs], refs[-outputs:]


# --- forward ---------------------------------------------------------------------------------


def _forward_kernel(*refs, st: Static):
    x_ref, w_ref, b_ref, seg_ref, _, (y_ref,) = _unpack(refs, st, 1)
    BT, BC = st.blocks.block_t, st.blocks.block_c
    _, length, channels = x_ref.shape
    tile = _Tile(pl.program_id(2), pl.program_id(0) * BT + iota((BT, 1), 0),
                 pl.program_id(1) * BC + iota((1, BC), 1), length, channels)
    w = _taps(w_ref, tile.cols, channels, st.size)
    z = _bias(b_ref, tile.cols, channels) if st.bias else 0.0
    own = tile.ids(seg_ref, 0) if st.documents else None
    for lag in range(st.size):
        same = tile.ids(seg_ref, -lag) == own if st.documents and lag else None
        z = z + w[lag] * tile.read(x_ref, -lag, same)
    tile.write(y_ref, z * sigmoid(z) if st.activation else z)


def _inputs(x, weight, bias, segment_ids):
    return [a for a in (x, weight, bias, segment_ids) if a is not None]



def forward(x, weight, bias, segment_ids, st: Static):
    """y `[B, T, C]` in x's dtype."""
    batch, length, channels = x.shape
    BT, BC = st.blocks.block_t, st.blocks.block_c
    return pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(pl.cdiv(length, BT), pl.cdiv(channels, BC), batch),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=triton_params(st.blocks.num_warps),
        interpret=st.interpret, name="short_conv_forward",
    )(*_inputs(x, weight, bias, segment_ids))


# --- backward --------------------------------------------------------------------------------


def backward_steps(length: int, blocks: BlockSizes) -> int:
    """Loop steps per backward program: the configured ones, fewer for a short row."""
    return min(blocks.backward_steps, pl.cdiv(length, blocks.backward_block_t))


def _backward_kernel(*refs, st: Static, steps: int):
    """The backward one time step (a `[BC]` row) at a time:
    z, g and their masks formed once a step; x, ids and g of the K − 1 steps before are
    carried. A loop iteration runs `backward_block_t` steps, read an iteration ahead, without
    document masks where no document starts within K − 1 steps of them."""
    x_ref, w_ref, b_ref, seg_ref, (dy_ref,), outs = _unpack(refs, st, 3 if st.bias else 2)
    dx_ref, dw_ref = outs[:2]
    U, BC, K = st.blocks.backward_block_t, st.blocks.backward_block_c, st.size
    _, length, channels = x_ref.shape
    run, b = pl.program_id(0), pl.program_id(2)
    cols = pl.program_id(1) * BC + iota((BC,), 0)
    inside = cols < channels
    w = _taps(w_ref, cols, channels, K)
    bias = _bias(b_ref, cols, channels) if st.bias else 0.0
    start = run * (steps * U)  # this program's steps: start .. start + steps·U − 1

    def read(t):
        """(x_t, dy_t) float32 `[BC]` (zero outside the row) and the id at t (or None)."""
        ok = (t >= 0) & (t < length)
        x, dy = (pltriton.load(ref.at[b, t, cols], mask=inside & ok, other=0).astype(F32)
                 for ref in (x_ref, dy_ref))
        seg = pltriton.load(seg_ref.at[b, t], mask=ok, other=-1) if st.documents else None
        return x, dy, seg

    def row(t, cur, past, sums, masked: bool):
        """Step t: g_t (and dw, db += its terms where `sums`), dx at s = t − K + 1 (`masked`:
        by documents). `past[j]`: (x, id, g) at t − 1 − j."""
        x, dy, seg = cur
        keep = lambda id_a, id_b, v: jnp.where(id_a == id_b, v, 0.0) if masked else v
        taps = [x] + [keep(past[i - 1][1], seg, past[i - 1][0]) for i in range(1, K)]
        g = dy
        if st.activation:
            z = bias
            for i in range(K):
                z = z + w[i] * taps[i]
            g = g * _silu_grad(z)
        if sums is not None:
            dw, db = sums
            sums = tuple(dw[i] + g * taps[i] for i in range(K)), db + g
        window = [(p, v) for _, p, v in reversed(past)] + [(seg, g)]  # ids, g at s .. t
        dx = w[0] * window[0][1]
        for u in range(1, K):
            dx = dx + w[u] * keep(window[u][0], window[0][0], window[u][1])
        s = t - (K - 1)
        pltriton.store(dx_ref.at[b, s, cols], dx.astype(dx_ref.dtype),
                       mask=inside & (s >= start) & (s < length))
        return ([(x, seg, g)] + past)[:K - 1], sums

    def rows(base, masked):
        def run_rows(cur, past, sums):
            for r in range(U):
                past, sums = row(base + r, cur[r], past, sums, masked)
            return past, sums
        return run_rows

    def step(j, carry):
        cur, past, sums = carry
        base = start + j * U
        ahead = [read(base + U + r) for r in range(U)]  # before this iteration's stores
        if st.documents:  # one document from s = base − K + 1 to base + U − 1: no masks
            ids = [p for _, p, _ in past] + [c[2] for c in cur]
            clean = functools.reduce(jnp.logical_and, [i == ids[-1] for i in ids[:-1]],
                                     jnp.bool_(True))
            past, sums = lax.cond(clean, rows(base, False), rows(base, True), cur, past, sums)
        else:
            past, sums = rows(base, False)(cur, past, sums)
        return ahead, past, sums

    zeros = jnp.zeros((BC,), F32)
    past = [read(start - 1 - j)[::2] + (zeros,) for j in range(K - 1)]
    cur = [read(start + r) for r in range(U)]
    cur, past, (dw, db) = lax.fori_loop(0, steps, step, (cur, past, ((zeros,) * K, zeros)))
    end = start + steps * U
    for r in range(K - 1):  # g at the K − 1 steps after the run: dx of its last steps
        past, _ = row(end + r, cur[r] if r < U else read(end + r), past, None, st.documents)
    for i in range(K):
        pltriton.store(dw_ref.at[b, run, i, cols], dw[i], mask=inside)
    if st.bias:
        pltriton.store(outs[2].at[b, run, cols], db, mask=inside)


def backward(x, weight, bias, segment_ids, dy, st: Static):
    """dx `[B, T, C]` (x's dtype) and float32 partial sums over the backward programs' runs
    of time: dw `[B, R, K, C]` and (with a bias) db `[B, R, C]`."""
    batch, length, channels = x.shape
    blocks = st.blocks
    steps = backward_steps(length, blocks)
    runs = pl.cdiv(length, steps * blocks.backward_block_t)
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype),
                 jax.ShapeDtypeStruct((batch, runs, st.size, channels), F32)]
    if st.bias:
        out_shape.append(jax.ShapeDtypeStruct((batch, runs, channels), F32))
    return pallas_call(
        functools.partial(_backward_kernel, st=st, steps=steps),
        grid=(runs, pl.cdiv(channels, blocks.backward_block_c), batch),
        out_shape=out_shape,
        compiler_params=triton_params(blocks.backward_num_warps, blocks.backward_num_stages),
        interpret=st.interpret, name="short_conv_backward",
    )(*_inputs(x, weight, bias, segment_ids), dy)
