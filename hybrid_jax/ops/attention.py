"""Softmax attention: causal, sliding-window and grouped-query; RoPE; scaled-cosine attention.

Layout `[batch, time, heads, head_dim]`. Logits and softmax run in float32 (float64 stays
float64); the output has the dtype of `q`.

Window convention (DESIGN.md): with `causal=True`, `window=w` lets the query at position t see
keys t−w+1..t (w keys, itself included). With `causal=False` the band is symmetric: keys with
|t − s| < w. `window=None` means no band.

Positions: a query and a key attend by their *positions*, by default `arange(S)` for keys and
`arange(T) + (S − T)` for queries (queries are the last T of the S key positions, as in a
prefill that continues a cache). Decode passes explicit positions; a key position < 0 marks an
empty cache slot. `segment_ids` (self-attention only) keep packed documents apart.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from hybrid_jax.ops.checks import (
    check_count,
    check_dims,
    check_divides,
    check_floating,
    check_integer,
    check_rank,
)
from hybrid_jax.ops.dispatch import Rung, backend, choose, dispatch
from hybrid_jax.ops.explicit_axes import typed_like_inputs
from hybrid_jax.ops.partition import shard_kernel
from pallas_kernels.flash_attention import api as pallas_flash
from pallas_kernels.flash_attention import splash

_OP = "attention"


@typed_like_inputs
def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
    segment_ids: jax.Array | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    segment_extents: pallas_flash.Extents | None = None,
    active_queries: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """Softmax attention `softmax(scale·q kᵀ + mask) v`.

    Args:
      q: `[B, T, Hq, D]` queries.
      k: `[B, S, Hkv, D]` keys; `Hkv` divides `Hq` (grouped-query attention).
      v: `[B, S, Hkv, Dv]` values.
      causal: mask keys at later positions than the query.
      window: band width (see module docstring); None for no band. Must be >= 1.
      scale: logit scale, default `D**-0.5`.
      segment_ids: `[B, T]` int document ids of the queries in packed sequences; without
        `kv_segment_ids` also those of the keys (then T == S). A query sees the keys of equal
        id wherever they are; models pass document numbers (`TokenContext`), so an id that
        comes back later in a row starts a new document there, as in the recurrences.
      q_positions: `[B, T]` or `[T]` int positions of the queries.
      kv_positions: `[B, S]` or `[S]` int positions of the keys; < 0 marks an empty slot.
      kv_segment_ids: `[B, S]` document ids of the keys, when they are not the queries' (a
        context-parallel shard attending to gathered keys); needs `segment_ids`.
      segment_extents: `segment_extents(segment_ids)` computed once for many calls on the
        same ids (a model's layers); the pallas rung reads it, the others need not.
      active_queries: `[B, T]` bool, the query rows whose output is wanted (Oryx's
        attention-mode tokens); the others are 0, so they pass no gradient. The pallas rung
        skips the query blocks that hold no active row (forward and backward); the others
        compute every row and zero them. (Unpacked, cuDNN over every row stays ahead of the
        flash kernel over half of them: BENCHMARKS.md, session 46.)
      implementation: "reference", "xla", "cudnn" (GPU, no segment_ids), "pallas" (GPU flash
        attention with segment_ids, `pallas_kernels.flash_attention`), "splash" (TPU: JAX's
        splash attention with segment_ids, `pallas_kernels.flash_attention.splash`) or None
        (auto: on a GPU cudnn, then pallas, on a TPU splash, then xla; `attention_rung` says
        which). The flash rungs take causal self-attention without explicit positions; the
        kernel rungs take values a multiple of the head dim wide as slices (`value_heads`).

    Returns:
      `[B, T, Hq, Dv]` in the dtype of `q`. A query that sees no key gets zeros.
    """
    check_inputs(q, k, v, window, segment_ids, q_positions, kv_positions, kv_segment_ids,
                 active_queries)
    if segment_extents is not None and (segment_ids is None or kv_segment_ids is not None):
        raise ValueError(f"{_OP}: segment_extents need the segment_ids of a self-attention "
                         "call (and no kv_segment_ids)")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return dispatch(
        _OP,
        _RUNGS,
        implementation,
        q,
        k,
        v,
        causal=causal,
        window=window,
        scale=scale,
        segment_ids=segment_ids,
        q_positions=q_positions,
        kv_positions=kv_positions,
        kv_segment_ids=kv_segment_ids,
        segment_extents=segment_extents,
        active_queries=active_queries,
    )


def segment_extents(segment_ids_BT: jax.Array) -> pallas_flash.Extents:
    """Where each token's document and contiguous run begin and end (`[B, T]` int32 each; one
    sort): the flash kernel's block bounds before the window. Depends on the ids only, so
    `TokenContext` computes it once per batch for every attention layer."""
    return pallas_flash.document_extents(segment_ids_BT)


def check_inputs(q, k, v, window, segment_ids, q_positions, kv_positions, kv_segment_ids,
                 active_queries=None) -> None:
    """Refuses inputs `attention` cannot take, naming what was expected and found."""
    sizes = check_dims(_OP, {}, q=(q, "BTHD"), k=(k, "BSGD"), v=(v, "BSG_"))
    if sizes["T"] == 0 or sizes["S"] == 0:
        raise ValueError(f"{_OP}: needs at least one query and one key, got q shape "
                         f"{tuple(q.shape)} and k shape {tuple(k.shape)}")
    check_floating(_OP, q=q, k=k, v=v)
    # Float ids or positions would compare (and mask) without error, but not as documented.
    check_integer(_OP, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                  q_positions=q_positions, kv_positions=kv_positions)
    check_divides(_OP, "num_kv_heads (axis 2 of k) must divide num_heads (axis 2 of q)",
                  sizes["G"], sizes["H"])
    _check_window(_OP, window)
    if kv_segment_ids is not None:
        if segment_ids is None:
            raise ValueError(f"{_OP}: kv_segment_ids need segment_ids (of the queries)")
        check_dims(_OP, sizes, kv_segment_ids=(kv_segment_ids, "BS"))
    if segment_ids is not None:
        if kv_segment_ids is None and sizes["T"] != sizes["S"]:
            raise ValueError(f"{_OP}: segment_ids without kv_segment_ids need self-attention "
                             f"(T == S), got T={sizes['T']}, S={sizes['S']}")
        check_dims(_OP, sizes, segment_ids=(segment_ids, "BT"))
    for name, pos, axis in (("q_positions", q_positions, "T"), ("kv_positions", kv_positions, "S")):
        if pos is not None:
            _check_positions(_OP, name, pos, sizes["B"], sizes[axis], axis)
    if active_queries is not None:
        check_dims(_OP, sizes, active_queries=(active_queries, "BT"))
        if active_queries.dtype != jnp.bool_:
            raise ValueError(f"{_OP}: active_queries must be bool [B, T], got "
                             f"{active_queries.dtype}")


def _check_window(op: str, window: int | None) -> None:
    check_count(op, "window", window, 1, optional=True)


def _check_positions(op: str, name: str, positions: jax.Array, batch: int, length: int,
                     axis: str = "T", where: str = "") -> None:
    """Positions `[axis]` (shared by the rows) or `[B, axis]`, as attention and RoPE take them."""
    if positions.shape not in ((length,), (batch, length)):
        raise ValueError(f"{op}: {name} must have shape [{axis}] = [{length}] or [B,{axis}] = "
                         f"{[batch, length]}{where}, got {tuple(positions.shape)}")


def _compute_dtype(x: jax.Array) -> jnp.dtype:
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def attention_mask(
    batch: int,
    num_queries: int,
    num_keys: int,
    *,
    causal: bool,
    window: int | None,
    segment_ids: jax.Array | None = None,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """The boolean `[B, T, S]` mask of which key each query may attend to (`kv_segment_ids`
    default: `segment_ids`)."""
    _check_window("attention_mask", window)  # window <= 0 would mask every key
    if q_positions is None:
        q_positions = jnp.arange(num_queries) + (num_keys - num_queries)
    if kv_positions is None:
        kv_positions = jnp.arange(num_keys)
    q_pos = jnp.broadcast_to(q_positions, (batch, num_queries))[:, :, None]
    k_pos = jnp.broadcast_to(kv_positions, (batch, num_keys))[:, None, :]
    mask = k_pos >= 0
    if causal:
        mask &= k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
        if not causal:
            mask &= k_pos - q_pos < window
    if segment_ids is not None:
        kv_segment_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
        mask &= segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    return mask


def masked_softmax(logits: jax.Array, mask: jax.Array, axis: int = -1) -> jax.Array:
    """Softmax over `axis` restricted to `mask`; rows with no valid entry give zeros.

    The row maximum is a constant shift (stop_gradient, as in `jax.nn.softmax`): its exact
    gradient is zero, and differentiating `max` divides by how many entries equal it, which is 0
    when XLA recomputes the logits with another rounding in another fusion (NaN gradients).
    """
    masked = jnp.where(mask, logits, -jnp.inf)
    row_max = jax.lax.stop_gradient(jnp.max(masked, axis=axis, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    weights = jnp.where(mask, jnp.exp(masked - row_max), 0.0)
    total = jnp.sum(weights, axis=axis, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def attention_reference(q, k, v, *, causal, window, scale, segment_ids, q_positions, kv_positions,
                        kv_segment_ids, segment_extents=None, active_queries=None):
    """The definition: every query against every key of its head, in float32/float64."""
    dtype = _compute_dtype(q)
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2).astype(dtype)
    v = jnp.repeat(v, group, axis=2).astype(dtype)
    logits = scale * jnp.einsum("bthd,bshd->bhts", q.astype(dtype), k)
    mask = attention_mask(q.shape[0], q.shape[1], k.shape[1], causal=causal, window=window,
                          segment_ids=segment_ids, q_positions=q_positions,
                          kv_positions=kv_positions, kv_segment_ids=kv_segment_ids)
    probs = masked_softmax(logits, mask[:, None])
    return _active_rows(jnp.einsum("bhts,bshd->bthd", probs, v).astype(q.dtype), active_queries)


def _active_rows(out_BTHV: jax.Array, active_queries: jax.Array | None) -> jax.Array:
    """The output with inactive query rows 0 (a rung that computes every row)."""
    if active_queries is None:
        return out_BTHV
    return jnp.where(active_queries[:, :, None, None], out_BTHV, jnp.zeros((), out_BTHV.dtype))


def attention_xla(q, k, v, *, causal, window, scale, segment_ids, q_positions, kv_positions,
                  kv_segment_ids, segment_extents=None, active_queries=None):
    """Grouped heads without repeating K/V; matmuls in the input dtype, softmax in float32."""
    batch, num_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    q_grouped = q.reshape(batch, num_q, num_kv_heads, num_heads // num_kv_heads, head_dim)
    dtype = _compute_dtype(q)
    logits = jnp.einsum("btkgd,bskd->bkgts", q_grouped, k, preferred_element_type=dtype)
    mask = attention_mask(batch, num_q, k.shape[1], causal=causal, window=window,
                          segment_ids=segment_ids, q_positions=q_positions,
                          kv_positions=kv_positions, kv_segment_ids=kv_segment_ids)
    probs = masked_softmax(logits * scale, mask[:, None, None])
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=dtype)
    return _active_rows(out.reshape(batch, num_q, num_heads, v.shape[-1]).astype(q.dtype),
                        active_queries)


def _cudnn_unsupported(q, k, v, *, causal, window, scale, segment_ids, q_positions,
                       kv_positions, kv_segment_ids, segment_extents=None,
                       active_queries=None) -> str | None:
    if backend() != "gpu":
        return f"needs a GPU backend, running on {backend()}"
    if q.dtype not in (jnp.bfloat16, jnp.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"needs bfloat16/float16 q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] != v.shape[-1] or q.shape[-1] % 8 or q.shape[-1] > 128:
        return f"needs head_dim == value dim, a multiple of 8 and <= 128, got {q.shape[-1]}, " \
               f"{v.shape[-1]}"
    if segment_ids is not None or q_positions is not None or kv_positions is not None:
        return "explicit positions / segment_ids are not supported"
    if causal and q.shape[1] != k.shape[1]:
        return "causal attention needs T == S"
    if window is not None and not causal:
        return "windowed attention needs causal=True"
    return None


def attention_cudnn(q, k, v, *, causal, window, scale, segment_ids, q_positions, kv_positions,
                    kv_segment_ids, segment_extents=None, active_queries=None):
    # Always `is_causal=True` together with a local window: without it JAX attends to the future.
    local_window = None if window is None else (window - 1, 0)
    out = jax.nn.dot_product_attention(
        q, k, v, scale=scale, is_causal=causal, local_window_size=local_window,
        implementation="cudnn",
    )
    return _active_rows(out, active_queries)  # cuDNN computes every row


def _flash_unsupported(platform, causal, q_positions, kv_positions, kv_segment_ids
                       ) -> str | None:
    """What the flash kernels (GPU and TPU) share: causal self-attention on `platform`."""
    if backend() != platform:
        return f"needs a {platform.upper()} backend, running on {backend()}"
    if not causal:
        return "needs causal=True"
    if q_positions is not None or kv_positions is not None:
        return "explicit positions are not supported"
    if kv_segment_ids is not None:
        return "separate key segment ids (context-parallel gathered keys) are not supported"
    return None


def _pallas_unsupported(q, k, v, *, causal, window, scale, segment_ids, q_positions,
                        kv_positions, kv_segment_ids, segment_extents=None,
                        active_queries=None) -> str | None:
    return (_flash_unsupported("gpu", causal, q_positions, kv_positions, kv_segment_ids)
            or pallas_flash.unsupported(q, k, v, segment_ids, window=window,
                                        extents=segment_extents,
                                        active_queries=active_queries))


def attention_pallas(q, k, v, *, causal, window, scale, segment_ids, q_positions, kv_positions,
                     kv_segment_ids, segment_extents=None, active_queries=None):
    """The flash kernels (`pallas_kernels.flash_attention`) on each device's batch and heads;
    named, not left to the entry point's default (the platform it reads), so that this rung
    never runs the kernels' XLA reference."""
    def kernel(q, k, v, segment_ids, extents, active):
        return pallas_flash.flash_attention(q, k, v, segment_ids, extents=extents,
                                            active_queries=active, window=window, scale=scale,
                                            implementation="gpu")

    return shard_kernel(_OP, kernel, (q, k, v, segment_ids, segment_extents, active_queries),
                        ("BTHD", "BTGD", "BTGD", "BT", "BT", "BT"), "BTHD")


def _splash_unsupported(q, k, v, *, causal, window, scale, segment_ids, q_positions,
                        kv_positions, kv_segment_ids, segment_extents=None,
                        active_queries=None) -> str | None:
    return (_flash_unsupported("tpu", causal, q_positions, kv_positions, kv_segment_ids)
            or _inside_shard_map() or splash.unsupported(q, k, v, segment_ids, window=window))


def _inside_shard_map() -> str | None:
    """JAX's splash kernels cannot trace under a `check_vma` shard_map (as the library's are);
    the rung's own `shard_kernel` opens one without the check."""
    manual = jax.sharding.get_abstract_mesh().manual_axes
    if manual:
        return (f"called inside a shard_map (manual mesh axes {sorted(manual)}): JAX's splash "
                "kernels do not state their outputs' varying mesh axes, which check_vma needs")
    return None


def attention_splash(q, k, v, *, causal, window, scale, segment_ids, q_positions, kv_positions,
                     kv_segment_ids, segment_extents=None, active_queries=None):
    """JAX's TPU splash attention (`pallas_kernels.flash_attention.splash`) on each device's
    batch and heads."""
    def kernel(q, k, v, segment_ids):
        return splash.splash_attention(q, k, v, segment_ids, window=window, scale=scale)

    out = shard_kernel(_OP, kernel, (q, k, v, segment_ids), ("BTHD", "BTGD", "BTGD", "BT"),
                       "BTHD", check_vma=False)
    return _active_rows(out, active_queries)  # splash computes every row


def value_heads(q, k, v) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Values `r = Dv / D` times wider than the head dim (Oryx's Mamba-2 attention mode: one
    key head, values of the whole inner width) as `r` heads of the head dim, the form the
    flash and cuDNN kernels take (they need value dim == head dim). Key head g becomes heads
    (g, j) for slices j (keys repeated), query head h of group g heads (g, j, h): the grouped-
    query mapping sends each to its slice. Exact (each slice has the same softmax); costs r
    times the q·kᵀ products, against the XLA rung's `[T, S]` logits in memory.
    `merge_value_heads` undoes it on the output. Arrays or ShapeDtypeStructs."""
    (batch, length, heads, dim), (kv_batch, keys, groups, _) = q.shape, k.shape
    r = _value_ratio(dim, v.shape[-1])
    if r == 1:
        return q, k, v
    q_heads = q.reshape(batch, length, groups, 1, heads // groups, dim)
    q_heads = jnp.broadcast_to(q_heads, (*q_heads.shape[:3], r, *q_heads.shape[4:]))
    return (q_heads.reshape(batch, length, heads * r, dim), jnp.repeat(k, r, axis=2),
            v.reshape(kv_batch, keys, groups * r, dim))


def merge_value_heads(out, groups: int, value_dim: int) -> jax.Array:
    """`[B, T, G·r·(H/G), D]` from the split call back to `[B, T, H, r·D]`."""
    batch, length, split_heads, dim = out.shape
    r = _value_ratio(dim, value_dim)
    if r == 1:
        return out
    out = out.reshape(batch, length, groups, r, split_heads // (groups * r), dim)
    return out.transpose(0, 1, 2, 4, 3, 5).reshape(batch, length, -1, value_dim)


def _value_ratio(head_dim: int, value_dim: int) -> int:
    """How many head-dim slices `value_heads` makes of the values (1: none, kept as they are)."""
    return value_dim // head_dim if value_dim > head_dim and value_dim % head_dim == 0 else 1


def _taking_wide_values(rung: Rung) -> Rung:
    """`rung` (a kernel that needs value dim == head dim) also for values a multiple of the head
    dim wide, through `value_heads`."""
    def unsupported(q, k, v, **kwargs):
        r = _value_ratio(q.shape[-1], v.shape[-1])
        if r == 1:
            return rung.unsupported(q, k, v, **kwargs)
        reason = rung.unsupported(*jax.eval_shape(value_heads, q, k, v), **kwargs)
        return reason and f"(values {v.shape[-1]} wide as {r} slices of {q.shape[-1]}) {reason}"

    def fn(q, k, v, **kwargs):
        return merge_value_heads(rung.fn(*value_heads(q, k, v), **kwargs), k.shape[2],
                                 v.shape[-1])

    return dataclasses.replace(rung, fn=fn, unsupported=unsupported)


_RUNGS = (
    *map(_taking_wide_values, (
        Rung("cudnn", attention_cudnn, _cudnn_unsupported, platforms=("gpu",)),
        Rung("pallas", attention_pallas, _pallas_unsupported, platforms=("gpu",)),
        Rung("splash", attention_splash, _splash_unsupported, platforms=("tpu",)))),
    Rung("xla", attention_xla),
    Rung("reference", attention_reference, auto=False),
)


def attention_rung(q, k, v, *, causal: bool = True, window: int | None = None,
                   segment_ids=None, active_queries=None, implementation: str | None = None
                   ) -> str:
    """The name of the rung `attention` runs for these arguments (arrays or ShapeDtypeStructs)
    on the current backend."""
    rung, _ = choose(_OP, _RUNGS, implementation, q, k, v, causal=causal, window=window,
                     scale=1.0, segment_ids=segment_ids, q_positions=None, kv_positions=None,
                     kv_segment_ids=None, active_queries=active_queries)
    return rung.name


def rotary_dim(head_dim: int, fraction: float) -> int:
    """Number of leading channels that RoPE rotates: `fraction·head_dim` rounded down to even."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"rope_fraction must be in [0, 1], got {fraction}")
    return int(head_dim * fraction) // 2 * 2


ROPE_SCALING_RULE = (
    "expected None or (factor, low_freq_factor, high_freq_factor, original_max_positions): "
    "finite numbers with factor > 0, 0 < low_freq_factor < high_freq_factor and "
    "original_max_positions > 0")


def is_rope_scaling(scaling: Any) -> bool:
    """Whether `scaling` is four numbers that `rope_frequencies` can divide by
    (`ROPE_SCALING_RULE`); a bool is not a number here."""
    if not isinstance(scaling, Sequence) or isinstance(scaling, str) or len(scaling) != 4:
        return False
    if not all(isinstance(s, int | float) and not isinstance(s, bool) and math.isfinite(s)
               for s in scaling):
        return False
    factor, low, high, original = scaling
    return factor > 0 and 0 < low < high and original > 0


def rope_frequencies(rot: int, theta: float, scaling: tuple[float, ...] | None = None
                     ) -> jax.Array:
    """The `rot/2` angular frequencies `theta^(−2i/rot)`, optionally rescaled Llama-3 style.

    `scaling = (factor, low_freq_factor, high_freq_factor, original_max_positions)`: waves
    longer than `original_max_positions / low_freq_factor` slow down by `factor`, waves shorter
    than `original_max_positions / high_freq_factor` stay, and those between interpolate.
    """
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not 0 < theta < math.inf:
        raise ValueError(f"rope theta must be a finite number > 0, got {theta!r}")  # else NaNs
    inv_freq = theta ** (-jnp.arange(rot // 2, dtype=jnp.float32) * 2 / rot)
    if scaling is None:
        return inv_freq
    if not is_rope_scaling(scaling):
        raise ValueError(f"rope scaling {scaling!r}: {ROPE_SCALING_RULE}")
    factor, low, high, original = (float(s) for s in scaling)
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return jnp.where(wavelength > original / low, inv_freq / factor,
                     jnp.where(wavelength < original / high, inv_freq, mid))


def apply_rope(
    x: jax.Array, positions: jax.Array, *, theta: float = 10000.0, fraction: float = 1.0,
    scaling: tuple[float, ...] | None = None,
) -> jax.Array:
    """Rotary position embedding on the first `rotary_dim` channels of `x` `[B, T, H, D]`.

    Pairs channel i with channel i + r/2 (the "rotate half" convention of Llama / GPT-NeoX and
    Hugging Face checkpoints), frequencies from `rope_frequencies(r, theta, scaling)`;
    `positions` is `[B, T]` or `[T]`. Channels past `r` pass through.
    """
    check_rank("apply_rope", "x", x, "BTHD")
    # An integer x would come back rounded, float positions rotate by fractional angles.
    check_floating("apply_rope", x=x)
    check_integer("apply_rope", positions=positions)
    _check_positions("apply_rope", "positions", positions, *x.shape[:2],
                     where=f" (x shape {tuple(x.shape)})")
    rot = rotary_dim(x.shape[-1], fraction)
    if rot == 0:
        return x
    half = rot // 2
    inv_freq = rope_frequencies(rot, theta, scaling)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B?, T, half]
    angles = jnp.broadcast_to(angles, (x.shape[0], x.shape[1], half))[:, :, None, :]
    return _rotate(x, jnp.cos(angles), jnp.sin(angles))


@jax.custom_vjp
def _rotate(x_BTHD: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x's first 2·r channels rotated pairwise (i with i + r) by the angles of `cos`, `sin`
    `[B, T, 1, r]` (float32, from positions: no gradient), in float32, rounded to x's dtype."""
    rot = 2 * cos.shape[-1]
    x1, x2 = jnp.split(x_BTHD[..., :rot].astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([rotated.astype(x_BTHD.dtype), x_BTHD[..., rot:]], axis=-1)


def _rotate_fwd(x, cos, sin):
    return _rotate(x, cos, sin), (cos, sin)


def _rotate_bwd(residuals, dy):
    # A rotation's transpose is the rotation by the opposite angle: one elementwise pass like
    # the forward's. Differentiated as written, the slices and concatenates made XLA's
    # backward 2-3x the forward's time (H200, 125M: 134 against 56 µs a layer).
    cos, sin = residuals
    return _rotate(dy, cos, -sin), None, None


_rotate.defvjp(_rotate_fwd, _rotate_bwd)


MAX_LOG_TEMPERATURE = math.log(100.0)


def cosine_logit_scale(log_temperature: jax.Array) -> jax.Array:
    """Swin-v2 scale `exp(min(τ, log 100))` of a per-head learnable log temperature τ."""
    return jnp.exp(jnp.minimum(log_temperature.astype(jnp.float32), MAX_LOG_TEMPERATURE))


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / ||x|| over the last axis, computed in float32, returned in x's dtype. Recomputed in
    the backward pass from x (autodiff would keep float32 copies of x until then)."""
    return _l2_normalize(x, eps)


@functools.partial(jax.checkpoint, static_argnums=(1,))
def _l2_normalize(x: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


@typed_like_inputs
def scaled_cosine_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    log_temperature: jax.Array,
    *,
    attend: Callable[..., jax.Array] | None = None,
    **attention_kwargs,
) -> jax.Array:
    """Attention on `cos(q, k)·exp(min(τ_h, log 100))` (Swin Transformer v2).

    `log_temperature` is `[Hq]`, one learnable τ per query head. The per-head scale is folded
    into the normalised queries, so every `attention` rung (cuDNN included) can run it.
    Other keyword arguments go to `attend` (default `attention`; e.g. its context-parallel
    form), except `scale`.
    """
    if "scale" in attention_kwargs:
        raise ValueError("scaled_cosine_attention: the scale comes from log_temperature; "
                         "do not pass scale=")
    if log_temperature.shape != (q.shape[2],):
        raise ValueError(f"scaled_cosine_attention: log_temperature must have shape [Hq] = "
                         f"[{q.shape[2]}], got {log_temperature.shape}")
    q_scaled = l2_normalize(q) * cosine_logit_scale(log_temperature)[:, None].astype(q.dtype)
    attend = attention if attend is None else attend
    return attend(q_scaled, l2_normalize(k), v, scale=1.0, **attention_kwargs)
