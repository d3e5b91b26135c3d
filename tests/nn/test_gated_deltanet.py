"""Gated DeltaNet block: the layer against a numpy per-token loop of its equations, decode equals
the parallel pass, packed documents are isolated, options are checked, inits follow fla."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.gated_deltanet import _a_log_init, _dt_bias_init
from hybrid_jax.ops import context_parallel
from hybrid_jax.registry import block_names
from tests.helpers import assert_close, assert_init_stds, normals
from tests.nn.test_lm import check_decode_matches


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def param(p) -> np.ndarray:
    return np.asarray(p[...], np.float64)


def project(x, linear) -> np.ndarray:
    """`x [B, T, D] · W [D, *out]` in float64."""
    return np.tensordot(x, param(linear.kernel), axes=1)


def rms(x, eps) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def jitted_mixer(config: ModelConfig):
    """The first layer's mixer of `create_model(config)` and its forward pass under jit:
    `forward(x_BTD, segment_ids_BT or None)`."""
    mixer = hj.create_model(config).blocks[0].mixer
    graphdef, state = nnx.split(mixer)

    @jax.jit
    def forward(x, segment_ids):
        ctx = TokenContext.create(x.shape[:2], segment_ids=segment_ids)
        return nnx.merge(graphdef, state)(x, ctx)

    return mixer, forward


def check_documents_isolated(config: ModelConfig, first=6, second=6, tol=1e-5):
    """A mixer on two packed documents gives each the output it gives it alone."""
    _, forward = jitted_mixer(config)
    x = normals(4, (2, first + second, config.d_model), dtype=np.float32)
    segments = jnp.asarray([[0] * first + [1] * second, [3] * first + [7] * second])
    packed = forward(x, segments)
    assert_close(packed[:, :first], forward(x[:, :first], None), tol, "first document")
    assert_close(packed[:, first:], forward(x[:, first:], None), tol, "second document")


def check_prefill_in_pieces(config: ModelConfig, T=11, pieces=(3, 8), tol=1e-5):
    """Decoding T tokens in multi-token pieces `[0, 3) [3, 8) [8, 11)` equals the parallel
    pass: the later pieces continue a non-empty cache through the chunked form (a chunked
    prefill, speculative verification), which `check_decode_matches` never reaches (its
    prefills start empty, its steps are single tokens)."""
    model = hj.create_model(config, seed=1)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, T)),
                         jnp.int32)
    graphdef, state = nnx.split(model)

    @jax.jit
    def in_pieces(state, tokens):
        model_ = nnx.merge(graphdef, state)
        cache, outs = model_.init_cache(tokens.shape[0], T), []
        for start, end in zip((0, *pieces), (*pieces, T), strict=True):
            logits, cache = model_.decode(tokens[:, start:end], cache)
            outs.append(logits)
        return jnp.concatenate(outs, axis=1)

    parallel = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, tokens)
    assert_close(in_pieces(state, tokens), parallel, tol, f"{config.layers[0].type} pieces")


def short_conv(u, conv) -> np.ndarray:
    """`silu(Σ_i w_i ⊙ u_{t−i} (+ b))` over the flattened heads of `u` `[B, T, ...]` (one
    document)."""
    weight, flat, T = param(conv.weight), u.reshape(*u.shape[:2], -1), u.shape[1]
    y = sum(weight[i] * np.pad(flat, ((0, 0), (i, 0), (0, 0)))[:, :T]
            for i in range(weight.shape[0]))
    return silu(y if conv.bias is None else y + param(conv.bias)).reshape(u.shape)


def gdn_reference(mixer, x, eps) -> np.ndarray:
    """The Gated DeltaNet layer (module docstring) token by token in float64 numpy."""
    T = x.shape[1]
    q, k, v = (silu(project(x, proj)) if conv is None else short_conv(project(x, proj), conv)
               for proj, conv in ((mixer.q_proj, mixer.q_conv), (mixer.k_proj, mixer.k_conv),
                                  (mixer.v_proj, mixer.v_conv)))
    q, k = (u / np.sqrt(np.sum(u * u, axis=-1, keepdims=True) + 1e-6) for u in (q, k))
    beta = 1.0 / (1.0 + np.exp(-project(x, mixer.b_proj)))
    g = -np.exp(param(mixer.A_log)) * softplus(project(x, mixer.a_proj) + param(mixer.dt_bias))
    state = np.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:])  # [B, H, K, V]
    out = np.zeros(v.shape)
    for t in range(T):
        state = np.exp(g[:, t])[..., None, None] * state
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", state, k[:, t]))
        state = state + k[:, t, :, :, None] * u[:, :, None, :]
        out[:, t] = np.einsum("bhkv,bhk->bhv", state, q[:, t] * q.shape[-1] ** -0.5)
    gated = rms(out, eps) * param(mixer.o_norm.scale) * silu(project(x, mixer.g_proj))
    return np.tensordot(gated, param(mixer.o_proj.kernel), axes=2)


@pytest.mark.parametrize("use_short_conv", [True, False])
def test_layer_matches_numpy_per_token_loop(use_short_conv):
    """Chunked forward (chunk 4, T = 11: a partial last chunk) against the equations (without
    short convs q, k, v get a plain SiLU)."""
    cfg = ModelConfig(layers=(layer("gdn", chunk_size=4, expand_v=1.5,
                                    use_short_conv=use_short_conv),),
                      vocab_size=8, d_model=8, num_heads=2, head_dim=4)
    mixer, forward = jitted_mixer(cfg)
    x = normals(0, (2, 11, 8), dtype=np.float32)
    expected = gdn_reference(mixer, np.asarray(x, np.float64), cfg.norm_eps)
    assert_close(forward(x, None), expected, 2e-6)


def test_head_dim_conv_size_and_norm_eps_of_their_own():
    """An explicit head size frees num_heads from d_model (3 heads of K = 3, V = 6 on d_model
    8), `conv_size` sets the taps of the three short convs, and the output norm takes the
    model's `norm_eps` (1e-2: large enough to move the output)."""
    cfg = ModelConfig(layers=(layer("gdn", num_heads=3, head_dim=3, expand_v=2, conv_size=2,
                                    chunk_size=4),),
                      vocab_size=8, d_model=8, num_heads=2, norm_eps=1e-2)
    mixer, forward = jitted_mixer(cfg)
    assert mixer.q_proj.kernel.shape == (8, 3, 3) and mixer.v_proj.kernel.shape == (8, 3, 6)
    assert [conv.weight.shape for conv in (mixer.q_conv, mixer.k_conv, mixer.v_conv)] == [
        (2, 9), (2, 9), (2, 18)]
    x = normals(1, (2, 9, 8), dtype=np.float32)
    expected = gdn_reference(mixer, np.asarray(x, np.float64), 1e-2)
    assert_close(forward(x, None), expected, 2e-6)


def test_projections_start_at_init_std_and_the_output_at_its_residual_scale():
    """Every input projection at `init_std`; W_o, which writes into the residual stream, at
    init_std / √(2·num_layers) (GPT-2): here 0.4 / √4 with two layers."""
    cfg = ModelConfig(layers=("gdn",) * 2, vocab_size=8, d_model=64, num_heads=2,
                      init_std=0.4)
    mixer = hj.create_model(cfg).blocks[0].mixer
    stds = dict.fromkeys(("q_proj", "k_proj", "v_proj", "g_proj", "a_proj", "b_proj"), 0.4)
    assert_init_stds(mixer, {**stds, "o_proj": 0.2}, rtol=0.2)  # ≥ 128 draws


def test_decode_matches_parallel_across_chunks():
    """A prefill ending mid-chunk, then token-by-token decoding, equals the parallel pass (with
    and without short convs)."""
    cfg = ModelConfig(layers=(layer("gdn", chunk_size=4),
                              layer("gdn", chunk_size=4, use_short_conv=False)),
                      vocab_size=32, d_model=16, num_heads=2)
    check_decode_matches(cfg, T=11, splits=(0, 6))


def test_cache_keeps_a_float32_state_whatever_its_dtype():
    """A bfloat16 cache: the short convs' last conv_size − 1 inputs in bfloat16, the
    `[B, H, K, V]` delta-rule state in float32 (none of the convs without short convs)."""
    cfg = ModelConfig(layers=(layer("gdn", conv_size=3), layer("gdn", use_short_conv=False)),
                      vocab_size=8, d_model=16, num_heads=2)
    model = hj.create_model(cfg)
    cache = model.blocks[0].mixer.init_cache(2, 9, jnp.bfloat16)
    assert (cache.state.shape, cache.state.dtype) == ((2, 2, 8, 16), jnp.float32)
    assert [c.inputs.shape for c in cache.convs] == [(2, 2, 16), (2, 2, 16), (2, 2, 32)]
    assert {c.inputs.dtype.name for c in cache.convs} == {"bfloat16"}
    assert model.blocks[1].mixer.init_cache(2, 9, jnp.bfloat16).convs == [None] * 3


def test_prefill_in_pieces_continues_the_state():
    """A second prefill of 5 tokens (across a chunk boundary) starts from the first's state
    (with and without short convs)."""
    cfg = ModelConfig(layers=(layer("gdn", chunk_size=4),
                              layer("gdn", chunk_size=4, use_short_conv=False)),
                      vocab_size=32, d_model=16, num_heads=2)
    check_prefill_in_pieces(cfg)


def test_the_op_gets_the_options_and_the_documents(monkeypatch):
    """The parallel pass hands the op the layer's chunk size and implementation and the
    context's segment ids."""
    cfg = ModelConfig(layers=(layer("gdn", chunk_size=2, implementation="reference"),),
                      vocab_size=8, d_model=16, num_heads=2)
    mixer = hj.create_model(cfg).blocks[0].mixer
    calls, op = [], context_parallel.gated_delta_rule

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return op(*args, **kwargs)

    monkeypatch.setattr(context_parallel, "gated_delta_rule", spy)
    ctx = TokenContext.create((1, 5), segment_ids=jnp.asarray([[0, 0, 1, 1, 1]]))
    mixer(normals(0, (1, 5, 16), dtype=np.float32), ctx)
    [kwargs] = calls
    assert (kwargs["chunk_size"], kwargs["implementation"]) == (2, "reference")
    assert kwargs["segment_ids"] is ctx.segment_ids


def test_packed_documents_are_isolated():
    """The second document starts mid-chunk; neither document sees the other's state."""
    check_documents_isolated(ModelConfig(layers=(layer("gdn", chunk_size=4),), vocab_size=8,
                                         d_model=16, num_heads=2))


def test_initialisation_follows_fla():
    """A = exp(A_log) in (0, 16]; dt = softplus(dt_bias) in [0.001, 0.1]; output norm γ = 1."""
    cfg = ModelConfig(layers=("gdn",), vocab_size=8, d_model=32, num_heads=32, head_dim=1,
                      ffn_dim=0)
    mixer = hj.create_model(cfg).blocks[0].mixer
    a, dt = np.exp(param(mixer.A_log)), softplus(param(mixer.dt_bias))
    assert np.all((a > 0) & (a <= 16)) and a.max() > 8 and a.min() < 8
    assert np.all((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001))
    assert np.all(param(mixer.o_norm.scale) == 1.0)
    # The distributions, from many draws of the initialisers: A uniform over (0, 16), log dt
    # uniform over [log 0.001, log 0.1] (32 heads cannot tell their ends from a shifted range).
    keys = jax.random.split(jax.random.key(0))
    a = np.exp(np.asarray(_a_log_init(keys[0], (8192,), jnp.float32), np.float64))
    assert a.min() < 0.01 and a.max() > 15.99 and abs(a.mean() - 8) < 0.2
    log_dt = np.log(softplus(np.asarray(_dt_bias_init(keys[1], (8192,), jnp.float32))))
    assert abs(log_dt.min() - np.log(1e-3)) < 0.01 and abs(log_dt.max() - np.log(0.1)) < 0.01
    assert abs(log_dt.mean() - np.log(1e-2)) < 0.06


def test_parameter_count_follows_the_equations():
    d, h, k, v, conv = 16, 2, 8, 16, 4
    cfg = ModelConfig(layers=("gdn",), vocab_size=10, d_model=d, num_heads=h, ffn_dim=0)
    model = nnx.eval_shape(lambda: hj.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    mixer = 2 * d * h * k + 2 * d * h * v + 2 * d * h + conv * h * (2 * k + v) + 2 * h + v
    mixer += h * v * d  # o_proj
    assert hj.count_params(model) == 10 * d + d + mixer + d  # embeddings, norms, mixer


@pytest.mark.parametrize("options, message", [
    (dict(expand_v=0.3), r"expand_v=0.3 times head_dim=8 is not a positive integer"),
    (dict(expand_v=-1), "expand_v=-1: expected a positive number"),
    (dict(expand_v=0), "expand_v=0: expected a positive number"),
    (dict(num_heads=3), "num_heads=3 does not divide d_model=16"),
    (dict(chunk_size=0), "chunk_size=0: expected a positive integer"),
    (dict(conv_size=0), "conv_size=0: expected a positive integer"),
    (dict(head_dim=0), "head_dim=0: expected a positive integer or None"),
    (dict(bogus=1), r"unknown option\(s\) \['bogus'\]"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(layers=(layer("gdn", **options),), d_model=16, num_heads=2)


def finite_mixer(spec):
    """The mixer of a one-layer model of `spec` (d_model 16, no FFN), after checking that the
    model's logits on a few tokens are finite."""
    model = hj.create_model(ModelConfig(layers=(spec,), vocab_size=8, d_model=16, num_heads=2,
                                        ffn_dim=0))
    assert np.all(np.isfinite(model(jnp.zeros((1, 3), jnp.int32))))
    return model.blocks[0].mixer


def test_smallest_options_are_accepted():
    """Sizes of 1 everywhere (head and value size 1, one-token chunks and convs) build a layer
    whose output is finite."""
    mixer = finite_mixer(layer("gdn", num_heads=16, expand_v=1, chunk_size=1, conv_size=1))
    assert mixer.v_proj.kernel.shape == (16, 16, 1)


def test_block_types_and_presets_are_registered():
    """(What `hybrid-jax list` prints from these registries is tested once, in test_cli.)"""
    assert {"gdn", "gsa"} <= set(block_names())
    assert {"gdn-tiny", "gdn-hybrid-tiny", "gdn-340m", "gsa-tiny", "gsa-hybrid-tiny"} <= set(
        presets.names())
