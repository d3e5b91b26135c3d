"""Building blocks shared by the mixers: projections, embeddings, norms, RoPE, convs, FFNs.

Parameters are created in `param_dtype` with a `logical_axes` name per dimension (see
`hybrid_jax.sharding`); the math runs in the compute `dtype`, with norms in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import ops
from hybrid_jax.cache import ConvCache, ConvHistory
from hybrid_jax.ops import context_parallel

Shape = int | Sequence[int]


def _tuple(shape: Shape) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def symmetric_uniform(bound: float):
    """Initializer drawing from U(−bound, bound)."""
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


def dt_bias_init(dt_min: float, dt_max: float, floor: float):
    """Initializer of a step-size bias: softplus⁻¹(dt) with dt log-uniform in [dt_min, dt_max],
    floored at `floor` (Mamba's and fla's), so that softplus(bias) starts at dt."""

    def init(key, shape, dtype):
        log_dt = jax.random.uniform(key, shape, jnp.float32, math.log(dt_min), math.log(dt_max))
        dt = jnp.maximum(jnp.exp(log_dt), floor)
        return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)

    return init


def param(rngs: nnx.Rngs, init, shape: Shape, dtype, axes: Sequence[str | None]) -> nnx.Param:
    """An `nnx.Param` from `init(key, shape, dtype)` carrying its logical axis names."""
    shape = _tuple(shape)
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match parameter shape {shape}")
    return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=tuple(axes))


class Linear(nnx.Module):
    """`y[..., *out] = x[..., *in] · W[*in, *out] (+ b)`: a projection with named axes.

    Multi-axis shapes keep heads explicit, e.g. `Linear(D, (H, K), axes=("embed", "heads",
    "head_dim"))` maps `[B, T, D]` to `[B, T, H, K]`.
    """

    def __init__(
        self,
        in_shape: Shape,
        out_shape: Shape,
        *,
        axes: Sequence[str | None],
        rngs: nnx.Rngs,
        std: float = 0.02,
        use_bias: bool = False,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    ):
        self.in_shape, self.out_shape = _tuple(in_shape), _tuple(out_shape)
        self.dtype = dtype
        self.init_std = std  # of the kernel as drawn (DeepNorm rescales it, nn/blocks.py)
        self.kernel = param(rngs, nnx.initializers.normal(std), self.in_shape + self.out_shape,
                            param_dtype, axes)
        self.bias = (
            param(rngs, nnx.initializers.zeros, self.out_shape, param_dtype,
                  axes[len(self.in_shape):])
            if use_bias else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        n_in = len(self.in_shape)
        if x.shape[x.ndim - n_in:] != self.in_shape:
            raise ValueError(f"Linear expects input [..., {', '.join(map(str, self.in_shape))}], "
                             f"got shape {x.shape}")
        y = jnp.tensordot(x.astype(self.dtype), self.kernel[...].astype(self.dtype), axes=n_in)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y

    def logits(self, x: jax.Array) -> jax.Array:
        """As an output head `[D] → [V]`: float32 logits with the backward in the compute dtype
        (`ops.logits`)."""
        if len(self.in_shape) != 1 or len(self.out_shape) != 1 or self.bias is not None:
            raise ValueError(f"Linear.logits needs one input and one output axis and no bias, got "
                             f"{self.in_shape} → {self.out_shape}, bias {self.bias is not None}")
        return ops.logits(x, self.kernel[...], vocab_axis=1, dtype=self.dtype)


class Embedding(nnx.Module):
    """Token embedding table `[vocab, d_model]`, also usable as a tied output head."""

    def __init__(self, vocab_size: int, d_model: int, *, rngs: nnx.Rngs, std: float = 0.02,
                 dtype=jnp.float32, param_dtype=jnp.float32):
        self.vocab_size = vocab_size
        self.dtype = dtype
        self.table = param(rngs, nnx.initializers.normal(std), (vocab_size, d_model), param_dtype,
                           ("vocab", "embed"))

    def __call__(self, tokens_BT: jax.Array) -> jax.Array:
        return jnp.take(self.table[...], tokens_BT, axis=0).astype(self.dtype)

    def attend(self, x_BTD: jax.Array) -> jax.Array:
        """Logits `x · Eᵀ` in float32, the backward in the compute dtype (`ops.logits`)."""
        return ops.logits(x_BTD, self.table[...], vocab_axis=0, dtype=self.dtype)


class RMSNorm(nnx.Module):
    """`x / rms(x) · γ` over the last axis, in float32; output in `dtype` (`ops.rms_norm`). Only
    x is kept for the backward pass. `implementation`: the op's rung ("xla", "pallas"; None:
    auto)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs: nnx.Rngs | None = None,
                 implementation: str | None = None):
        self.eps, self.dtype, self.implementation = eps, dtype, implementation
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return ops.rms_norm(x, self.scale[...], eps=self.eps, dtype=jnp.dtype(self.dtype),
                            implementation=self.implementation)


class GatedRMSNorm(nnx.Module):
    """RMSNorm with a SiLU gate `z`, over groups of `group_size` channels
    (`ops.gated_rms_norm`; only x, z and γ are kept for the backward pass).

    `norm_before_gate=True`: `norm(x)·γ·silu(z)` (Gated DeltaNet's per-head output norm).
    `norm_before_gate=False`: `norm(x·silu(z))·γ` (Mamba-2's grouped norm).
    `implementation`: the op's rung ("xla", "pallas"; None: auto).
    """

    def __init__(self, dim: int, *, group_size: int | None = None, norm_before_gate: bool = True,
                 eps: float = 1e-6, dtype=jnp.float32, param_dtype=jnp.float32,
                 implementation: str | None = None):
        group_size = dim if group_size is None else group_size
        if dim % group_size:
            raise ValueError(f"GatedRMSNorm: group_size={group_size} does not divide dim={dim}")
        self.group_size, self.norm_before_gate = group_size, norm_before_gate
        self.eps, self.dtype, self.implementation = eps, dtype, implementation
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))

    def __call__(self, x: jax.Array, z: jax.Array) -> jax.Array:
        return ops.gated_rms_norm(x, z, self.scale[...], group_size=self.group_size,
                                  norm_before_gate=self.norm_before_gate, eps=self.eps,
                                  dtype=jnp.dtype(self.dtype),
                                  implementation=self.implementation)


class RoPE(nnx.Module):
    """Rotary position embedding (no parameters): see `hybrid_jax.ops.apply_rope`."""

    def __init__(self, *, theta: float = 10000.0, fraction: float = 1.0,
                 scaling: tuple[float, ...] | None = None):
        self.theta, self.fraction, self.scaling = theta, fraction, scaling

    def __call__(self, x_BTHD: jax.Array, positions_BT: jax.Array) -> jax.Array:
        return ops.apply_rope(x_BTHD, positions_BT, theta=self.theta, fraction=self.fraction,
                              scaling=self.scaling)


class SwiGLU(nnx.Module):
    """`W_down(silu(W_gate x) ⊙ W_up x)`."""

    def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs, std: float = 0.02,
                 out_std: float | None = None, dtype=jnp.float32, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.gate = Linear(d_model, hidden, axes=("embed", "mlp"), std=std, **kw)
        self.up = Linear(d_model, hidden, axes=("embed", "mlp"), std=std, **kw)
        self.down = Linear(hidden, d_model, axes=("mlp", "embed"),
                           std=std if out_std is None else out_std, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return gated_down(jax.nn.silu, self.gate(x), self.up(x), self.down)


def gated_down(activation, gate: jax.Array, value: jax.Array, down: Linear) -> jax.Array:
    """`down(activation(gate) ⊙ value)`, keeping only `gate` and `value` (dot outputs) for the
    backward pass: the activation's terms and the product are recomputed there, fused into the
    backward's own elementwise work (autodiff would keep 3–5 more arrays of the hidden width)."""
    return jax.checkpoint(lambda g, v: down(activation(g) * v))(gate, value)


class ShortConv(nnx.Module):
    """Depthwise causal 1-D convolution over time (kernel `size`), optionally followed by SiLU.

    `y_t = Σ_{i<size} w_i ⊙ x_{t−i} (+ b)` (`hybrid_jax.ops.short_conv`). With `segment_ids`,
    inputs from another document are treated as zeros, so packed sequences do not leak.
    Decoding keeps the last `size − 1` inputs. `axis` names the channels' logical axis (a
    head or hidden axis that tensor parallelism splits), or None.
    """

    def __init__(self, channels: int, size: int = 4, *, rngs: nnx.Rngs, axis: str | None = None,
                 activation: bool = True, use_bias: bool = False, dtype=jnp.float32,
                 param_dtype=jnp.float32, implementation: str | None = None):
        if size < 1:
            raise ValueError(f"ShortConv: size must be >= 1, got {size}")
        self.size, self.activation, self.dtype = size, activation, dtype
        self.head_channels, self.implementation = axis is not None, implementation
        bound = size ** -0.5  # PyTorch's default Conv1d init for depthwise kernels
        self.weight = param(rngs, symmetric_uniform(bound), (size, channels), param_dtype,
                            ("conv", axis))
        self.bias = (param(rngs, nnx.initializers.zeros, (channels,), param_dtype, (axis,))
                     if use_bias else None)

    def _conv(self, x_BTC: jax.Array, op=ops.short_conv, **kwargs) -> jax.Array:
        """`op(x, w, b, ...)` (the op or its context-parallel form) in the compute dtype."""
        bias = None if self.bias is None else self.bias[...]
        y = op(x_BTC, self.weight[...], bias, activation=self.activation,
               head_channels=self.head_channels, **kwargs)
        return y.astype(self.dtype)

    def __call__(self, x_BTC: jax.Array, segment_ids_BT: jax.Array | None = None) -> jax.Array:
        # Under context parallelism each time shard convolves with a halo of the previous one.
        return self._conv(x_BTC, context_parallel.short_conv, segment_ids=segment_ids_BT,
                          implementation=self.implementation)

    def init_cache(self, batch: int, channels: int, dtype) -> ConvCache:
        return ConvCache(jnp.zeros((batch, self.size - 1, channels), dtype))

    def decode(self, x_BTC: jax.Array, cache: ConvCache | ConvHistory
               ) -> tuple[jax.Array, ConvCache | ConvHistory]:
        """Convolves new inputs continuing `cache` (any number of new steps); a `ConvHistory`
        (holding exactly the last `size − 1` inputs) comes back holding them all."""
        window = jnp.concatenate([cache.inputs.astype(jnp.float32), x_BTC.astype(jnp.float32)],
                                 axis=1)
        past = self.size - 1
        # The window's first `past` outputs lack their history: computed and dropped (a few
        # rows; the XLA rung, as a decode step is too short for a kernel launch to pay).
        y = self._conv(window, implementation="xla")[:, past:]
        if isinstance(cache, ConvHistory):
            return y, ConvHistory(window.astype(cache.inputs.dtype))
        new_inputs = window[:, window.shape[1] - past:].astype(cache.inputs.dtype)
        return y, ConvCache(new_inputs)


def run_convs(convs: Sequence[ShortConv], inputs: Sequence[jax.Array],
              segment_ids_BT: jax.Array | None = None, caches: Sequence[ConvCache] | None = None
              ) -> tuple[list[jax.Array], list[ConvCache] | None]:
    """Each conv on its input: with `caches` (decoding) continuing them and returning the new
    caches, else over whole sequences (restarting at `segment_ids_BT` document starts), None."""
    if caches is None:
        return [conv(x, segment_ids_BT) for conv, x in zip(convs, inputs, strict=True)], None
    stepped = [conv.decode(x, c) for conv, x, c in zip(convs, inputs, caches, strict=True)]
    return [y for y, _ in stepped], [c for _, c in stepped]
