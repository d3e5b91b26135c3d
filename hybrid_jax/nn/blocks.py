"""Blocks: mixers composed with a branch layout and a residual scheme, all chosen by config.

A **mixer** (attention, Mamba-2, Gated DeltaNet, GSS, an FFN, ...) maps `x_BTD` to `y_BTD`
given the per-token `TokenContext` (`Mixer` protocol) and registers with `register_mixer`.
A **block** (`Block`, the one implementation) holds named branches, each a mixer, and combines
them in one of two layouts:

    sequential   for each branch f in order:  x ← residual(x, f)          (mixer → FFN)
    parallel     y = Σ_i w_i · bn_i(f_i(h)),  x ← residual(x, y)          (all branches on h)

with one of three residual schemes (`residual=`):

    pre_norm     x + f(norm(x))                (h = norm(x) in a parallel block)
    post_norm    norm(x + f(x))                (h = x)
    deepnorm     norm(α·x + f(x)),  α = (kL)^{1/4}   (Wang et al. 2022, L = number of layers,
                 k = residual sublayers per layer: the branches of a sequential block, 2 for a
                 parallel one, so α = (2L)^{1/4} for attention → FFN), with DeepNet's init
                 (its Fig. 2 `deepnorm_init`): every `Linear` kernel of the branches
                 Xavier-normal, std = gain·√(2/(fan_in + fan_out)), gain
                 β = (4kL)^{−1/4} on the value/output/FFN kernels (each mixer names them in
                 `deepnorm_scaled`) and 1 on the others (queries, keys, gates). A SwiGLU's gate
                 keeps gain 1: scaling it too would shrink the arm by β³, not β².
                 `deepnorm_alpha = deepnorm_beta = 1` is DeepNet's Post-LN baseline.

Parallel options: `branch_norm` (an RMSNorm `bn_i` on each branch's output) and `mixing`:
"sum" (w_i = 1), "fixed" (w_i = 1/n) or "learned" (w_i = softplus(p_i) / Σ_j softplus(p_j),
one raw scalar p_i per branch, initialised to `mixing_init`; the weights are reported as
diagnostics `mixing_<branch>`).

Block types (names in `ModelConfig.layers`): every mixer registered with
`register_mixer_block` is also a block type of the same name: a pre-norm sequential block of
the mixer then a SwiGLU "ffn" (none when `ffn_dim == 0`) whose branches are named `mixer` and
`ffn`. The generic types "sequential" and "parallel" take `branches` (mixer names or
`layer(name, **options)`), e.g. `layer("parallel", branches=("gdn", "attention", "ffn"))`;
further block types are presets of `BlockOptions` (registered `defaults`), e.g. "pha".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.cache import BlockCache
from hybrid_jax.config import LayerSpec, ModelConfig, resolve_options
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.common import norm, run_on_automatic_axes
from hybrid_jax.nn.diagnostics import report
from hybrid_jax.nn.ffn import FFN, FFNOptions
from hybrid_jax.nn.layers import Linear
from hybrid_jax.ops.norms import rms_normalize
from hybrid_jax.registry import mixer_type, register_block, register_mixer
from hybrid_jax.sharding import constrain, type_spec

LAYOUTS = ("sequential", "parallel")
RESIDUALS = ("pre_norm", "post_norm", "deepnorm")
MIXINGS = ("sum", "fixed", "learned")
SOFTPLUS_INV_1 = math.log(math.e - 1.0)  # softplus(p) = 1: equal weights at init


class Mixer(Protocol):
    """What a block needs from a branch; `x_BTD` in, `y_BTD` out.

    Optional (class) attribute `deepnorm_scaled`: dotted names of the `Linear`s whose initial
    kernels DeepNorm scales by β (value, output and FFN projections).
    """

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array: ...

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> Any: ...

    def decode(self, x_BTD: jax.Array, cache: Any, ctx: TokenContext
               ) -> tuple[jax.Array, Any]: ...


def deepnorm_constants(num_layers: int, sublayers_per_layer: int = 2) -> tuple[float, float]:
    """DeepNorm's `(α, β) = ((kL)^{1/4}, (4kL)^{−1/4})` for L layers of k residual sublayers.

    DeepNet's bound on the model update sums `(v² + w²)/α²` over the S = kL post-norm
    sublayers and sets it to 1 with v = w = β and α = S^{1/4}: its decoder-only formulas are
    k = 2 (attention, FFN: `(2L)^{1/4}`, `(8L)^{−1/4}`) and its encoder-decoder's decoder
    k = 3 (self-attention, cross-attention, FFN: `(3M)^{1/4}`, `(12M)^{−1/4}`)."""
    sublayers = sublayers_per_layer * num_layers
    return sublayers ** 0.25, (4 * sublayers) ** -0.25


def xavier_std(linear: Linear) -> float:
    """Xavier (Glorot) normal std of a `Linear`: `√(2 / (fan_in + fan_out))`."""
    return math.sqrt(2.0 / (math.prod(linear.in_shape) + math.prod(linear.out_shape)))


def deepnorm_init(branch: nnx.Module, beta: float) -> None:
    """DeepNet's init of one branch, in place: each `Linear` kernel (drawn normal with its
    `init_std`) rescaled to Xavier-normal std, times `beta` for the `deepnorm_scaled` ones."""
    scaled = {id(functools.reduce(getattr, path.split("."), branch))
              for path in getattr(branch, "deepnorm_scaled", ())}
    for _, linear in nnx.iter_graph(branch):
        if isinstance(linear, Linear) and linear.init_std > 0:
            gain = beta if id(linear) in scaled else 1.0
            # A whole-value set, not `kernel[...] =`: under a trace (create_model's jit,
            # eval_shape) flax's indexed set reads the tracer's `sharding`, whose error message
            # walks the trace so far: quadratic in the model's size (~2 s for pha-180m).
            linear.kernel.set_value(linear.kernel[...] * (gain * xavier_std(linear)
                                                          / linear.init_std))


@functools.partial(jax.checkpoint, static_argnums=(5, 6))
def combine_branches(x_BTD: jax.Array, ys_BTD: tuple[jax.Array, ...], weights: jax.Array,
                     branch_scales: tuple[jax.Array, ...] | None, out_scale: jax.Array | None,
                     alpha: float, eps: float) -> jax.Array:
    """A parallel block's tail `norm_out(α·x + Σ_i w_i · norm_i(y_i))` in float32, in x's dtype.

    `branch_scales`: the γ of each `norm_i` (None: no branch norms); `out_scale`: the output
    norm's γ (None: pre-norm, `x + Σ ...`). Recomputed in the backward from x and the `y_i`:
    autodiff of the norms and the mixing one by one keeps each `norm_i(y_i)` (the weights'
    gradient reads it) and `α·x + Σ` (the output norm's recompute), four more `[B, T, D]`
    activations a layer, and rounds each term to x's dtype (the weights' gradients are then
    reductions over `[B, T, D]` in bf16)."""
    mixed = 0.0
    for i, y in enumerate(ys_BTD):
        y = y.astype(jnp.float32)
        if branch_scales is not None:
            y = rms_normalize(y, eps) * branch_scales[i].astype(jnp.float32)
        mixed = mixed + weights[i] * y
    out = alpha * x_BTD.astype(jnp.float32) + mixed
    if out_scale is not None:
        out = rms_normalize(out, eps) * out_scale.astype(jnp.float32)
    return out.astype(x_BTD.dtype)


def mixing_weights(logits: jax.Array) -> jax.Array:
    """`softplus(p) / Σ softplus(p)` in float32: positive and summing to 1 for any p."""
    w = jax.nn.softplus(logits.astype(jnp.float32))
    return w / jnp.sum(w)


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    """Options of the generic blocks ("sequential", "parallel") and their presets ("pha").

    `branches`: mixer names or `layer(name, **options)`; `names`: attribute names of the
    branches (None: their mixer names, repeated ones numbered `attention_2`, ...).
    `deepnorm_alpha` / `deepnorm_beta`: None for DeepNorm's formulas of the model's depth.
    """

    branches: tuple[Any, ...] = ("attention", "ffn")
    names: tuple[str, ...] | None = None
    layout: str = "sequential"
    residual: str = "pre_norm"
    branch_norm: bool = False
    mixing: str = "sum"
    mixing_init: float = SOFTPLUS_INV_1
    deepnorm_alpha: float | None = None
    deepnorm_beta: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "branches", tuple(LayerSpec.parse(b) for b in self.branches))
        for field, value, allowed in (("layout", self.layout, LAYOUTS),
                                      ("residual", self.residual, RESIDUALS),
                                      ("mixing", self.mixing, MIXINGS)):
            if value not in allowed:
                raise ValueError(f"BlockOptions.{field}={value!r}: expected one of {list(allowed)}")
        if not self.branches:
            raise ValueError("BlockOptions.branches: expected at least one branch")
        if self.names is not None and len(self.names) != len(self.branches):
            raise ValueError(f"BlockOptions.names={self.names}: expected one name per branch "
                             f"({len(self.branches)})")
        if self.layout == "sequential" and (self.branch_norm or self.mixing != "sum"):
            raise ValueError("BlockOptions: branch_norm and mixing apply to layout='parallel' "
                             f"only, got branch_norm={self.branch_norm}, mixing={self.mixing!r}")

    def branch_names(self) -> tuple[str, ...]:
        if self.names is not None:
            return tuple(self.names)
        names, seen = [], {}
        for spec in self.branches:
            seen[spec.type] = seen.get(spec.type, 0) + 1
            names.append(spec.type if seen[spec.type] == 1 else f"{spec.type}_{seen[spec.type]}")
        return tuple(names)

    def branch_options(self, model: ModelConfig) -> list[tuple[str, type, Any]]:
        """`(name, module class, resolved options)` of every branch."""
        out = []
        for name, spec in zip(self.branch_names(), self.branches, strict=True):
            kind = mixer_type(spec.type)
            where = f"branch {name!r} ({spec.type!r})"
            out.append((name, kind.module, resolve_options(kind.options, model, spec.options,
                                                           where)))
        return out

    def check(self, model: ModelConfig) -> None:
        self.branch_options(model)


class Block(nnx.Module):
    """Named branches in a sequential or parallel layout with a residual scheme (module
    docstring). Branch `name` is the attribute `name`; its norm is `name_norm` (the input norm
    in pre-norm sequential blocks, the output norm otherwise)."""

    def __init__(self, config: ModelConfig, branches: Sequence[tuple[str, nnx.Module]], *,
                 layout: str = "sequential", residual: str = "pre_norm",
                 branch_norm: bool = False, mixing: str = "sum",
                 mixing_init: float = SOFTPLUS_INV_1, alpha: float = 1.0, beta: float = 1.0):
        self.names = tuple(name for name, _ in branches)
        self.layout, self.residual, self.mixing = layout, residual, mixing
        self.alpha, self.beta = float(alpha), float(beta)
        self.norm_eps = config.norm_eps
        parallel = layout == "parallel"
        for name, module in branches:
            setattr(self, f"{name}_norm", norm(config) if not parallel or branch_norm else None)
            setattr(self, name, module)
            if residual == "deepnorm":
                deepnorm_init(module, beta)
        self.input_norm = norm(config) if parallel and residual == "pre_norm" else None
        self.output_norm = norm(config) if parallel and residual != "pre_norm" else None
        # One raw scalar per branch, float32 whatever the model's parameter dtype.
        self.mixing_logits = (nnx.Param(jnp.full((len(branches),), mixing_init, jnp.float32),
                                        logical_axes=(None,)) if mixing == "learned" else None)

    def weights(self) -> jax.Array:
        """The `[n]` float32 branch weights of a parallel block."""
        n = len(self.names)
        if self.mixing == "learned":
            return mixing_weights(self.mixing_logits[...])
        return jnp.full((n,), 1.0 / n if self.mixing == "fixed" else 1.0, jnp.float32)

    def report_weights(self, weights: jax.Array) -> None:
        """Reports learned branch weights as diagnostics `mixing_<branch>` (`[n]`; in a scanned
        stack `nnx.scan` stacks them over the groups, `[G]` a branch)."""
        if self.mixing == "learned":
            for i, name in enumerate(self.names):
                report(self, f"mixing_{name}", weights[i])

    def _residual(self, x: jax.Array, y: jax.Array, out_norm: nnx.Module | None) -> jax.Array:
        if self.residual == "pre_norm":
            x = x + y
        else:
            x = out_norm(self.alpha * x + y)
        return constrain(x, ("batch", "seq", "embed"))

    def _apply(self, x_BTD: jax.Array, ctx: TokenContext, caches: tuple | None):
        """The block on `x_BTD`; with `caches` (decoding) each branch continues its cache."""
        new_caches = []

        def run(name: str, h: jax.Array) -> jax.Array:
            branch = getattr(self, name)
            if caches is None:
                return branch(h, ctx)
            y, cache = branch.decode(h, caches[len(new_caches)], ctx)
            new_caches.append(cache)
            return y

        if self.layout == "sequential":
            for name in self.names:
                branch_norm = getattr(self, f"{name}_norm")
                if self.residual == "pre_norm":
                    x_BTD = self._residual(x_BTD, run(name, branch_norm(x_BTD)), None)
                else:
                    x_BTD = self._residual(x_BTD, run(name, x_BTD), branch_norm)
        else:
            h = x_BTD if self.input_norm is None else self.input_norm(x_BTD)
            weights = self.weights()
            ys = tuple(run(name, h) for name in self.names)
            norms = [getattr(self, f"{name}_norm") for name in self.names]
            branch_scales = None if norms[0] is None else tuple(n.scale[...] for n in norms)
            out_scale = None if self.output_norm is None else self.output_norm.scale[...]
            self.report_weights(weights)
            x_BTD = constrain(combine_branches(x_BTD, ys, weights, branch_scales, out_scale,
                                               self.alpha, self.norm_eps),
                              ("batch", "seq", "embed"))
        return x_BTD, BlockCache(tuple(new_caches))

    def __call__(self, x_BTD: jax.Array, ctx: TokenContext) -> jax.Array:
        # On its own under a mesh with explicit axes too (inside a LanguageModel: plain).
        return run_on_automatic_axes(self, lambda block, x, ctx: block._apply(x, ctx, None)[0],
                                     lambda: type_spec(x_BTD), x_BTD, ctx)

    def init_cache(self, batch: int, max_len: int, dtype: Any) -> BlockCache:
        return BlockCache(tuple(getattr(self, name).init_cache(batch, max_len, dtype)
                                for name in self.names))

    def decode(self, x_BTD: jax.Array, cache: BlockCache, ctx: TokenContext
               ) -> tuple[jax.Array, BlockCache]:
        return run_on_automatic_axes(
            self, lambda block, x, cache, ctx: block._apply(x, ctx, cache.branches),
            lambda: (type_spec(x_BTD), jax.tree.map(type_spec, cache)), x_BTD, cache, ctx)


def build_block(config: ModelConfig, options: BlockOptions, *, layer_index: int,
                rngs: nnx.Rngs) -> Block:
    """The registry builder of "sequential", "parallel" and their presets."""
    del layer_index
    alpha = beta = 1.0
    if options.residual == "deepnorm":
        # Sequential: one post-norm residual per branch. Parallel: one residual around all
        # branches, counted as DeepNet's two-sublayer layer (the PHA paper's (2L)^{1/4}).
        per_layer = len(options.branches) if options.layout == "sequential" else 2
        alpha, beta = deepnorm_constants(len(config.layers), per_layer)
        alpha = alpha if options.deepnorm_alpha is None else options.deepnorm_alpha
        beta = beta if options.deepnorm_beta is None else options.deepnorm_beta
    branches = [(name, module(config, branch_options, rngs=rngs))
                for name, module, branch_options in options.branch_options(config)]
    return Block(config, branches, layout=options.layout, residual=options.residual,
                 branch_norm=options.branch_norm, mixing=options.mixing,
                 mixing_init=options.mixing_init, alpha=alpha, beta=beta)


register_block("sequential", BlockOptions,
               "branches in sequence, each with its residual (pre-norm by default)")(build_block)
register_block("parallel", BlockOptions,
               "branches in parallel on one input, combined by a (learnable) mixer",
               defaults={"layout": "parallel"})(build_block)


def register_mixer_block(name: str, options: type, description: str):
    """Class decorator: registers a mixer module as mixer `name` and as block type `name` (a
    pre-norm sequential block: the mixer, then a SwiGLU "ffn" unless `ffn_dim == 0`)."""

    def decorate(module: type) -> type:
        register_mixer(name, options, description)(module)

        def build(config: ModelConfig, layer_options: Any, *, layer_index: int,
                  rngs: nnx.Rngs) -> Block:
            branches = [("mixer", module(config, layer_options, rngs=rngs))]
            if config.resolved_ffn_dim:
                branches.append(("ffn", FFN(config, FFNOptions(), rngs=rngs)))
            return Block(config, branches)

        build.__name__ = f"build_{name}_block"
        register_block(name, options, f"pre-norm {description} + SwiGLU")(build)
        return module

    return decorate
