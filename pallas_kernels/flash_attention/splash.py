"""Causal / sliding-window attention over packed documents on TPU: JAX's Pallas splash attention
(`jax.experimental.pallas.ops.tpu.splash_attention`) in this package's layout and conventions.

Same contract as `api.flash_attention`: queries `[B, T, H, D]`, keys and values `[B, T, G, D]`
(G | H), segment ids `[B, T]` (None: one document per row), window `w`: the query at t sees keys
t−w+1..t of its document. What this adds around JAX's kernels:

* Layout: they take one batch row, heads major (`[H, T, D]`, keys `[G, T, D]`; their MHA kernel
  reads kv head h // (H/G), our GQA grouping), so the batch is a vmap and the heads move.
* Scale: they have none; q is multiplied by `scale` first (in float32, then rounded to q's
  dtype: exact for the power-of-two scales of D = 64, 256; in bfloat16 one more rounding of q
  for D = 128).
* Window: `w` keys, the query's own included, is `LocalMask((w − 1, 0))`; w ≥ T is causal.
* Length: their blocks (multiples of 128 tokens) must divide T, so T is padded to a multiple of
  128 after the real tokens, the padding joining the last document: causal masking keeps it out of
  the real rows, and every padded row sees itself (an empty row would divide by zero, and its NaN
  would reach dk, dv through the backward's rowsum(o·dO)).
* The masks are static (numpy, block-sparse over the causal triangle or the window's band) and
  built once per shape. Segment ids do not skip blocks (splash's block sparsity comes from the
  static mask only): a packed row costs its causal triangle or band, not its documents.

The block sizes are 512 tokens where T allows (MaxText's defaults), not tuned on a TPU here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from pallas_kernels.flash_attention.checks import unsupported_arguments, unsupported_on

LANES = 128  # the kernels' block sizes are multiples of this many tokens
BLOCKS = (512, 256, 128)  # tried largest first: the first that divides the padded length
_TPU_DTYPES = (jnp.bfloat16, jnp.float32)


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None = None,
    *,
    window: int | None = None,
    scale: float | None = None,
    block_sizes: splash.BlockSizes | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Causal attention (window `w`: keys t−w+1..t) within documents; differentiable.

    Args:
      q: `[B, T, H, D]`; k, v: `[B, T, G, D]` with G dividing H.
      segment_ids: `[B, T]` integer document ids, or None.
      window: w >= 1, or None for full causal.
      scale: logit scale, default `D**-0.5`.
      block_sizes: the splash kernels' tiles (default `default_block_sizes` of the padded T);
        each must divide T rounded up to a multiple of 128.
      interpret: run the kernels in Pallas interpret mode (CPU tests).

    Returns:
      `[B, T, H, D]` in the dtype of q.
    """
    reason = unsupported(q, k, v, segment_ids, window=window, interpret=interpret)
    if reason is not None:
        raise ValueError(f"splash_attention: {reason}")
    length = q.shape[1]
    padded = -(-length // LANES) * LANES
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    window = None if window is not None and window >= length else window
    blocks = block_sizes or default_block_sizes(padded)
    kernel = _kernel(q.shape[2], padded, window, blocks, interpret)

    def heads_major(x):  # [B, T, H, D] → [B, H, T_padded, D]
        return jnp.pad(x, [(0, 0), (0, padded - length), (0, 0), (0, 0)]).transpose(0, 2, 1, 3)

    ids = None if segment_ids is None else jnp.pad(
        segment_ids.astype(jnp.int32), [(0, 0), (0, padded - length)], mode="edge")
    out = jax.vmap(lambda q, k, v, ids: kernel(
        q, k, v, segment_ids=None if ids is None else splash.SegmentIds(ids, ids)))(
        heads_major(_scaled(q, scale)), heads_major(k), heads_major(v), ids)
    return out.transpose(0, 2, 1, 3)[:, :length]


def _scaled(q: jax.Array, scale: float) -> jax.Array:
    """`scale·q`, computed in float32 (or wider) and rounded once to q's dtype."""
    return (q.astype(jnp.promote_types(q.dtype, jnp.float32)) * scale).astype(q.dtype)


def default_block_sizes(padded_length: int) -> splash.BlockSizes:
    """The same tile for every kernel: the largest of `BLOCKS` that divides the length."""
    block = next(b for b in BLOCKS if padded_length % b == 0)
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                             block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                             block_q_dq=block, block_kv_dq=block)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, length: int, window: int | None, blocks: splash.BlockSizes,
            interpret: bool):
    """The splash kernel (forward and backward) for one batch row of `heads` heads."""
    shape = (length, length)
    mask = (splash.CausalMask(shape) if window is None
            else splash.LocalMask(shape, window_size=(window - 1, 0), offset=0))
    # Built outside the caller's trace, its block tables kept as numpy: constants of every
    # trace that uses them, on no device in particular.
    with jax.ensure_compile_time_eval():
        kernel = splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), block_sizes=blocks,
                                        head_shards=1, q_seq_shards=1, interpret=interpret)
    return jax.tree.map(np.asarray, kernel)


def unsupported(q, k, v, segment_ids=None, *, window=None, interpret=False) -> str | None:
    """None when the kernels can run this call, else the reason. `interpret`: no TPU limits
    (dtype, head dims), as in interpret mode."""
    reason = unsupported_arguments(q, k, v, segment_ids, window)
    if reason is None and not interpret:
        reason = unsupported_on("TPU", q, k, v, _TPU_DTYPES)
    return reason
