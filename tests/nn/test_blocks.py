"""The block interface: a new mixer is one op, one module and one registration; the per-token
context reaches mixers in the parallel forward, decode and generate; parallel blocks and the
residual schemes."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.generate import generate
from hybrid_jax.nn import diagnostics
from hybrid_jax.nn.blocks import register_mixer_block
from hybrid_jax.nn.common import dense_kwargs
from hybrid_jax.nn.layers import Linear
from hybrid_jax.ops.segments import document_starts, reset_state
from tests.helpers import assert_close
from tests.nn.test_gated_deltanet import rms
from tests.nn.test_lm import check_decode_matches
from tests.test_context_parallel_models import CONFIG as EVERY_BLOCK

# --- a toy mixer: the op, the module, the registration ---------------------------------------


def toy_op(x_BTD, decay, *, initial_state=None, segment_ids=None):
    """y_t = decay·y_{t−1} + x_t per channel, reset at document starts; returns (y, state)."""
    starts = document_starts("toy_op", segment_ids, *x_BTD.shape[:2])
    starts = jnp.zeros(x_BTD.shape[:2], bool) if starts is None else starts
    state = jnp.zeros_like(x_BTD[:, 0]) if initial_state is None else initial_state

    def step(state, inputs):
        start, x_t = inputs
        state = decay * reset_state(state, start) + x_t
        return state, state

    state, y = jax.lax.scan(step, state, (starts.T, jnp.moveaxis(x_BTD, 1, 0)))
    return jnp.moveaxis(y, 0, 1), state


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    decay: float = 0.5


@register_mixer_block("toy", ToyOptions, "a decayed running sum (test mixer)")
class ToyMixer(nnx.Module):
    def __init__(self, config, options, *, rngs):
        self.decay = options.decay
        self.in_proj = Linear(config.d_model, config.d_model, axes=("embed", "mlp"),
                              **dense_kwargs(config, rngs))
        self.out_proj = Linear(config.d_model, config.d_model, axes=("mlp", "embed"),
                               **dense_kwargs(config, rngs))

    def __call__(self, x, ctx):
        return self.out_proj(toy_op(self.in_proj(x), self.decay,
                                    segment_ids=ctx.segment_ids)[0])

    def init_cache(self, batch, max_len, dtype):
        return jnp.zeros((batch, self.in_proj.out_shape[0]), jnp.float32)

    def decode(self, x, cache, ctx):
        y, state = toy_op(self.in_proj(x), self.decay, initial_state=cache)
        return self.out_proj(y), state


SMALL = dict(vocab_size=32, d_model=16, num_heads=2)


def _train_step_changes_the_loss(config):
    model = hj.create_model(config)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 9)), jnp.int32)

    def loss_fn(model):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @nnx.jit  # one compile; eagerly every op of the forward and backward compiles on its own
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    before = step(model, optimizer)
    assert float(nnx.jit(loss_fn)(model)) < float(before)


def test_toy_mixer_in_sequential_and_parallel_blocks_trains_and_decodes():
    config = ModelConfig(layers=("toy", layer("parallel", branches=("toy", "attention", "ffn"),
                                              mixing="learned", branch_norm=True)), **SMALL)
    check_decode_matches(config, T=9, splits=(0, 4))
    _train_step_changes_the_loss(config)


# --- the per-token context reaches the mixers --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EchoOptions:
    pass


@register_mixer_block("echo", EchoOptions, "writes the per-token 'mode' array (test mixer)")
class EchoMixer(nnx.Module):
    def __init__(self, config, options, *, rngs):
        self.width = config.d_model

    def __call__(self, x, ctx):
        return jnp.broadcast_to(ctx.extra("mode")[..., None].astype(x.dtype), x.shape)

    def init_cache(self, batch, max_len, dtype):
        return None

    def decode(self, x, cache, ctx):
        return self(x, ctx), None


ECHO = ModelConfig(layers=("echo", layer("parallel", branches=("echo", "attention"))),
                   ffn_dim=0, **SMALL)


def test_extras_reach_mixers_in_forward_and_decode():
    model = hj.create_model(ECHO)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 7)), jnp.int32)
    mode = jnp.asarray(np.random.default_rng(1).integers(0, 3, (2, 7)), jnp.float32)
    parallel = model(tokens, extras={"mode": mode})
    assert float(jnp.max(jnp.abs(parallel - model(tokens, extras={"mode": mode + 1})))) > 1e-3
    batch_ctx = TokenContext.from_batch({"inputs": tokens, "extra.mode": mode})
    assert_close(model(tokens, batch_ctx), parallel, 1e-6, "from_batch")
    cache = model.init_cache(2, 7)
    logits, cache = model.decode(tokens[:, :3], cache, extras={"mode": mode[:, :3]})
    steps = [logits]
    for t in range(3, 7):
        logits, cache = model.decode(tokens[:, t:t + 1], cache, extras={"mode": mode[:, t:t + 1]})
        steps.append(logits)
    assert_close(jnp.concatenate(steps, axis=1), parallel, 1e-5, "decode")
    with pytest.raises(ValueError, match="needs the per-token array 'mode'"):
        model(tokens)
    schedule = jnp.zeros((2, 7 + 3))
    assert generate(model, tokens, 3, extras={"mode": schedule}).shape == (2, 3)
    with pytest.raises(ValueError, match=r"extras\['mode'\]: expected leading shape"):
        generate(model, tokens, 3, extras={"mode": mode})


# --- parallel blocks, residual schemes, diagnostics --------------------------------------------


def test_deepnorm_and_post_norm_decode_equals_parallel():
    for residual in ("post_norm", "deepnorm"):
        config = ModelConfig(layers=(layer("sequential", branches=("gdn", "ffn"),
                                           residual=residual),
                                     layer("parallel", branches=("gss", "attention"),
                                           residual=residual)), **SMALL)
        check_decode_matches(config, T=7, splits=(3,))


def _unfused_parallel(block, x, ctx):
    """The parallel block module by module: `residual(x, Σ_i w_i · norm_i(branch_i(h)))`."""
    h = x if block.input_norm is None else block.input_norm(x)
    weights, mixed = block.weights(), 0.0
    for i, name in enumerate(block.names):
        y, branch_norm = getattr(block, name)(h, ctx), getattr(block, f"{name}_norm")
        mixed = mixed + weights[i] * (y if branch_norm is None else branch_norm(y))
    return block._residual(x, mixed, block.output_norm)


@pytest.mark.parametrize("residual,branch_norm", [("deepnorm", True), ("pre_norm", True),
                                                  ("post_norm", False)])
def test_parallel_tail_in_one_recomputed_function_keeps_values_and_gradients(residual,
                                                                           branch_norm):
    """`combine_branches` (norms, mixing and residual in one `jax.checkpoint`) equals the
    module-by-module composition in float32: output and gradients w.r.t. x and every
    parameter (mixing logits and norm scales included)."""
    config = ModelConfig(layers=(layer("parallel", branches=("toy", "ffn"), mixing="learned",
                                       branch_norm=branch_norm, residual=residual,
                                       mixing_init=0.3),), **SMALL)
    block = hj.create_model(config, seed=2).blocks[0]
    graphdef, params, rest = nnx.split(block, nnx.Param, ...)
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(3), p.shape),
                          params)  # scales ≠ 1, logits unequal
    x = jax.random.normal(jax.random.key(4), (2, 5, SMALL["d_model"]))
    ctx = TokenContext.create((2, 5))
    weights = jax.random.normal(jax.random.key(5), x.shape)

    def loss(run):
        return lambda x, params: jnp.sum(weights * run(nnx.merge(graphdef, params, rest), x,
                                                        ctx))

    fused = jax.value_and_grad(loss(lambda b, x, ctx: b(x, ctx)), argnums=(0, 1))(x, params)
    unfused = jax.value_and_grad(loss(_unfused_parallel), argnums=(0, 1))(x, params)
    assert_close(fused[0], unfused[0], 1e-6, "value")
    assert_close(fused[1], unfused[1], 1e-5, "gradients")


@pytest.mark.parametrize("residual", ["pre_norm", "post_norm"])
def test_parallel_branches_read_the_normalised_input_only_in_pre_norm(residual):
    """Pre-norm: every branch reads h = x / rms(x) · γ and the block returns x + Σ_i f_i(h);
    post-norm: h = x, out = RMSNorm(x + Σ_i f_i(x)) (γs set away from 1; numpy norms)."""
    config = ModelConfig(layers=(layer("parallel", branches=("toy", "ffn"),
                                       residual=residual),), **SMALL)
    block = hj.create_model(config, seed=2).blocks[0]
    norm = block.input_norm if residual == "pre_norm" else block.output_norm
    gamma = np.linspace(0.5, 2.0, SMALL["d_model"])
    norm.scale[...] = jnp.asarray(gamma, jnp.float32)
    x = np.random.default_rng(0).normal(size=(2, 5, SMALL["d_model"])).astype(np.float32)
    ctx = TokenContext.create((2, 5))

    h = rms(x, config.norm_eps) * gamma if residual == "pre_norm" else x
    mixed = sum(np.asarray(getattr(block, name)(jnp.asarray(h), ctx)) for name in block.names)
    want = x + mixed if residual == "pre_norm" else rms(x + mixed, config.norm_eps) * gamma
    assert_close(block(jnp.asarray(x), ctx), want, 1e-5, residual)


@pytest.mark.parametrize("residual", ["pre_norm", "deepnorm"])
def test_sequential_branches_each_take_their_residual(residual):
    """Sequential, branch by branch: pre-norm x ← x + f_i(RMSNorm_i(x)); DeepNorm (post-norm)
    x ← RMSNorm_i(α·x + f_i(x)), the branch reading x itself (γs set away from 1; numpy
    norms; α = (2L)^{1/4} of one layer of two sublayers)."""
    config = ModelConfig(layers=(layer("sequential", branches=("toy", "ffn"),
                                       residual=residual),), **SMALL)
    block = hj.create_model(config, seed=2).blocks[0]
    gammas = {}
    for i, name in enumerate(block.names):
        gammas[name] = np.linspace(0.5, 2.0, SMALL["d_model"]) * (i + 1)
        getattr(block, f"{name}_norm").scale[...] = jnp.asarray(gammas[name], jnp.float32)
    x = np.random.default_rng(0).normal(size=(2, 5, SMALL["d_model"])).astype(np.float32)
    ctx = TokenContext.create((2, 5))

    want, alpha = x, 2 ** 0.25
    assert block.alpha == (alpha if residual == "deepnorm" else 1.0)
    for name in block.names:
        f = lambda h, name=name: np.asarray(getattr(block, name)(jnp.asarray(h), ctx))  # noqa: E731
        want = (want + f(rms(want, config.norm_eps) * gammas[name]) if residual == "pre_norm" else
                rms(alpha * want + f(want), config.norm_eps) * gammas[name])
    assert_close(block(jnp.asarray(x), ctx), want, 1e-5, residual)


@pytest.mark.parametrize("mixing,expected", [("sum", [1.0, 1.0, 1.0]),
                                              ("fixed", [1 / 3, 1 / 3, 1 / 3]),
                                              ("learned", [0.2, 0.3, 0.5])])
def test_mixing_rules_weigh_the_branches(mixing, expected):
    """"sum": w_i = 1; "fixed": 1/n; "learned": softplus(p_i) / Σ softplus(p_j), here with
    p = softplus⁻¹(2, 3, 5)."""
    config = ModelConfig(layers=(layer("parallel", branches=("toy", "attention", "ffn"),
                                       mixing=mixing),), **SMALL)
    block = hj.create_model(config).blocks[0]
    if mixing == "learned":
        block.mixing_logits[...] = jnp.log(jnp.expm1(jnp.asarray([2.0, 3.0, 5.0])))
    assert_close(block.weights(), jnp.asarray(expected), 1e-6, mixing)


def test_repeated_branch_types_are_numbered_and_kept_apart():
    """Branches of one type get the names `attention`, `attention_2`, ...: each is its own
    module with its own parameters (one name for both would run one of them twice)."""
    branches = ("attention", "ffn", "attention")
    model = hj.create_model(ModelConfig(layers=(layer("parallel", branches=branches),), **SMALL))
    block = model.blocks[0]
    assert block.names == ("attention", "ffn", "attention_2")
    first, second = block.attention.q_proj.kernel[...], block.attention_2.q_proj.kernel[...]
    assert first.shape == second.shape and not np.allclose(first, second)


def test_bad_block_options_are_named():
    with pytest.raises(ValueError, match="BlockOptions.residual='deep'"):
        ModelConfig(layers=(layer("parallel", residual="deep"),), **SMALL)
    with pytest.raises(ValueError, match=r"branch 'attention' \('attention'\): unknown option"):
        ModelConfig(layers=(layer("parallel", branches=(layer("attention", slots=2),)),), **SMALL)
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        ModelConfig(layers=(layer("parallel", branches=("nope",)),), **SMALL)
    with pytest.raises(ValueError, match="layout='parallel' only"):
        ModelConfig(layers=(layer("sequential", mixing="learned"),), **SMALL)


def test_diagnostics_are_recorded_only_when_asked():
    config = ModelConfig(layers=(layer("parallel", branches=("attention", "ffn"),
                                       mixing="learned"),), **SMALL)
    model = hj.create_model(config)
    tokens = jnp.zeros((1, 4), jnp.int32)
    before = jax.tree.structure(nnx.state(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flax deprecates a sow outside nnx.capture
        plain = model(tokens)
        out, reported = diagnostics.recorded(lambda m: m(tokens), model)
    assert_close(out, plain, 1e-6)
    assert sorted(reported) == ["blocks.0.mixing_attention", "blocks.0.mixing_ffn"]
    assert_close([reported["blocks.0.mixing_attention"]], [jnp.asarray(0.5)], 1e-6)
    assert jax.tree.structure(nnx.state(model)) == before  # nothing stored on the model
    assert sorted(diagnostics.scalars(reported)) == ["diag/blocks.0.mixing_attention",
                                                     "diag/blocks.0.mixing_ffn"]


@pytest.mark.parametrize("spec", [
    layer("gdn"), layer("mamba2"), layer("mamba1"), layer("nha", short_conv=True),
    layer("oryx", linear_mixer="gdn"), layer("oryx", linear_mixer="mamba2")],
    ids=["gdn", "mamba2", "mamba1", "nha", "oryx-gdn", "oryx-mamba2"])
def test_conv_implementation_reaches_every_short_conv(spec):
    """A mixer's `conv_implementation` option is the rung its short convs ask `ops.short_conv`
    for (the benchmarks' `--conv`): an unknown one is refused by the op, naming it."""
    spec = layer(spec.type, **{**dict(spec.options), "conv_implementation": "fused"})
    config = ModelConfig(layers=(spec,), d_model=32, num_heads=2, vocab_size=64)
    model = hj.create_model(config)
    with pytest.raises(ValueError, match="short_conv: implementation='fused' is not available"):
        model(jnp.zeros((1, 8), jnp.int32))


def test_deepnorm_scaled_names_are_linears_of_every_mixer():
    """Each mixer's and FFN's `deepnorm_scaled` paths (DeepNet's β-scaled value and output
    projections) name `Linear`s of it, in every block type of the whole stack (a misspelt
    name would raise only when a DeepNorm model with that mixer is built)."""
    model = nnx.eval_shape(lambda: hj.create_model(EVERY_BLOCK, seed=0))
    owners = [m for _, m in nnx.iter_graph(model) if getattr(m, "deepnorm_scaled", None)]
    assert {type(m).__name__ for m in owners} >= {
        "AttentionMixer", "Mamba2Mixer", "GatedDeltaNetMixer", "GSAMixer", "NHAMixer",
        "GSSMixer", "Mamba1Mixer", "OryxMixer"}, {type(m).__name__ for m in owners}
    for owner in owners:
        for path in owner.deepnorm_scaled:
            target = owner
            for name in path.split("."):
                target = getattr(target, name)
            assert isinstance(target, Linear), (type(owner).__name__, path, type(target))
