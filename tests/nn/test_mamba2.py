"""Mamba-2 mixer: decode = parallel, an independent numpy per-token forward, packed documents,
option errors, presets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.registry import block_names
from tests.helpers import assert_close, assert_init_stds, assert_packed_documents_isolated
from tests.nn.test_gated_deltanet import check_prefill_in_pieces, silu
from tests.nn.test_lm import check_decode_matches

SMALL = layer("mamba2", ssm_head_dim=4, state_size=8, n_groups=2, chunk_size=4)


def small_config(*layers, **kwargs) -> ModelConfig:
    # Large projections (init_std 0.5) make the state's contribution to the output large, so
    # a state leaking across a document boundary shows as a large error.
    return ModelConfig(layers=layers or (SMALL,), vocab_size=32, d_model=16, num_heads=2,
                       init_std=0.5, **kwargs)


def first_mixer(config: ModelConfig):
    return hj.create_model(config, seed=2).blocks[0].mixer


@pytest.fixture(scope="module")
def mixer():
    return first_mixer(small_config())


def mixer_forward(mixer, x_BTD, segment_ids_BT=None):
    """The mixer's parallel forward pass, jitted."""
    graphdef, state = nnx.split(mixer)
    return jax.jit(lambda s, x, seg: nnx.merge(graphdef, s)(
        x, TokenContext.create(x.shape[:2], segment_ids=seg)))(state, x_BTD, segment_ids_BT)


def numpy_params(module) -> dict:
    """Every parameter of `module` as float64 numpy, keyed by its dotted path."""
    flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
    return {".".join(map(str, path)): np.asarray(v[...], np.float64) for path, v in flat}


def starts_of(segment_ids, shape):
    if segment_ids is None:
        starts = np.zeros(shape, bool)
        starts[:, 0] = True
        return starts
    seg = np.asarray(segment_ids)
    return np.concatenate([np.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)


def numpy_conv(x, weight, bias, starts, activation=True):
    """Causal depthwise conv `y_t = Σ_i w_i x_{t−i} + b` within each document, then SiLU
    (unless `activation` is False)."""
    batch, T, _ = x.shape
    y = np.zeros_like(x)
    for b in range(batch):
        doc_start = 0
        for t in range(T):
            doc_start = t if starts[b, t] else doc_start
            for lag in range(min(len(weight), t - doc_start + 1)):
                y[b, t] += weight[lag] * x[b, t - lag]
    return silu(y + bias) if activation else y + bias


def mamba2_numpy(p, x, starts, *, groups, eps, conv_activation=True, gated_norm=True):
    """Mamba-2 mixer from the equations, one token at a time, in float64 (the options of the
    same names drop the convs' SiLU and the gated norm)."""
    x = np.asarray(x, np.float64)
    batch, T, _ = x.shape
    xs = np.einsum("btd,dhp->bthp", x, p["x_proj.kernel"])
    H, P = xs.shape[2:]
    B, C = (np.einsum("btd,dgn->btgn", x, p[f"{name}_proj.kernel"]) for name in "bc")
    N = B.shape[-1]
    dt = np.log1p(np.exp(x @ p["dt_proj.kernel"] + p["dt_bias"]))  # softplus
    xs = numpy_conv(xs.reshape(batch, T, -1), p["x_conv.weight"], p["x_conv.bias"],
                    starts, conv_activation).reshape(batch, T, H, P)
    B, C = (numpy_conv(y.reshape(batch, T, -1), p[f"{name}_conv.weight"],
                       p[f"{name}_conv.bias"], starts, conv_activation
                       ).reshape(batch, T, groups, N)
            for name, y in (("b", B), ("c", C)))
    A = -np.exp(p["A_log"])
    y = np.zeros_like(xs)
    for b in range(batch):
        for h in range(H):
            g = h // (H // groups)
            state = np.zeros((P, N))
            for t in range(T):
                decay = 0.0 if starts[b, t] else np.exp(dt[b, t, h] * A[h])
                state = decay * state + dt[b, t, h] * np.outer(xs[b, t, h], B[b, t, g])
                y[b, t, h] = state @ C[b, t, g] + p["D"][h] * xs[b, t, h]
    if not gated_norm:
        return np.einsum("bthp,hpd->btd", y, p["out_proj.kernel"])
    z = np.einsum("btd,dhp->bthp", x, p["z_proj.kernel"])
    gated = (y * silu(z)).reshape(batch, T, groups, -1)
    normed = gated / np.sqrt(np.mean(gated ** 2, axis=-1, keepdims=True) + eps)
    normed = normed.reshape(batch, T, H, P) * p["norm.scale"].reshape(H, P)
    return np.einsum("bthp,hpd->btd", normed, p["out_proj.kernel"])


@pytest.mark.parametrize("packed", [False, True])
def test_mixer_matches_numpy_per_token(mixer, packed):
    """Chunked forward (T=11 over chunks of 4, 2 groups) against the numpy loop; with packed
    documents the state and the conv restart at each document start."""
    x = np.random.default_rng(0).standard_normal((2, 11, 16))
    seg = jnp.asarray([[0] * 4 + [1] * 7, [0] * 9 + [1] * 2]) if packed else None
    got = mixer_forward(mixer, jnp.asarray(x, jnp.float32), seg)
    want = mamba2_numpy(numpy_params(mixer), x, starts_of(seg, x.shape[:2]), groups=2,
                        eps=small_config().norm_eps)
    assert_close(got, want, 1e-5)


def test_attention_compatible_parts_and_options_of_their_own():
    """`conv_activation=False, gated_norm=False` (Oryx's converted attention): plain convs and
    out = W_out·y, without z_proj or norm; with them, `conv_size` 2 and the model's norm_eps
    (1e-2, large enough to move the output) reach the convs and the gated norm."""
    x = np.random.default_rng(1).standard_normal((2, 9, 16))
    seg = jnp.asarray([[0] * 4 + [1] * 5, [0] * 9])
    for options in (dict(conv_activation=False, gated_norm=False), dict(conv_size=2)):
        mixer = first_mixer(small_config(layer("mamba2", ssm_head_dim=4, state_size=8,
                                               n_groups=2, chunk_size=4, **options),
                                         norm_eps=1e-2))
        assert mixer.x_conv.weight.shape[0] == options.get("conv_size", 4)
        assert (mixer.norm is None) == (mixer.z_proj is None) == ("gated_norm" in options)
        want = mamba2_numpy(numpy_params(mixer), x, starts_of(seg, x.shape[:2]), groups=2,
                            eps=1e-2, **{k: v for k, v in options.items() if k != "conv_size"})
        assert_close(mixer_forward(mixer, jnp.asarray(x, jnp.float32), seg), want, 1e-5,
                     str(options))


def test_projections_start_at_init_std_and_the_output_at_its_residual_scale():
    """Every input projection at `init_std`; W_out, which writes into the residual stream, at
    init_std / √(2·num_layers) (GPT-2): here 0.4 / √4 with two layers."""
    mixer = first_mixer(small_config(SMALL, SMALL).replace(init_std=0.4))
    stds = dict.fromkeys(("z_proj", "x_proj", "b_proj", "c_proj", "dt_proj"), 0.4)
    assert_init_stds(mixer, {**stds, "out_proj": 0.2}, rtol=0.2)  # ≥ 128 draws


def test_cache_keeps_a_float32_state_whatever_its_dtype():
    """A bfloat16 cache: the convs' last conv_size − 1 inputs (x: H·P = 32, B and C: G·N =
    16 channels) in bfloat16, the `[B, H, P, N]` SSM state in float32."""
    cache = first_mixer(small_config()).init_cache(2, 9, jnp.bfloat16)
    assert (cache.state.shape, cache.state.dtype) == ((2, 8, 4, 8), jnp.float32)
    assert [c.inputs.shape for c in cache.convs] == [(2, 3, 32), (2, 3, 16), (2, 3, 16)]
    assert {c.inputs.dtype.name for c in cache.convs} == {"bfloat16"}


def test_decode_matches_parallel_across_chunks():
    """Prefills longer than a chunk carry the state into the chunked form; then single steps."""
    check_decode_matches(small_config(), T=11, splits=(0, 6))


def test_prefill_in_pieces_continues_the_state():
    """Later multi-token prefills continue the conv inputs and the SSM state (chunked SSD
    with an initial state)."""
    check_prefill_in_pieces(small_config(SMALL, SMALL))


def test_packed_document_equals_document_alone():
    """Logits of packed documents equal those of each document alone."""
    assert_packed_documents_isolated(hj.create_model(small_config()), lengths=(5, 9))


@pytest.mark.parametrize("options, message", [
    (dict(ssm_head_dim=5), r"ssm_head_dim=5 does not divide d_inner=expand·d_model=32"),
    (dict(ssm_head_dim=4, n_groups=3), r"n_groups=3 does not divide the number of heads"),
    (dict(state_size=0), r"Mamba2Options.state_size=0: expected a positive integer"),
    (dict(dt_min=0.5, dt_max=0.1), r"expected 0 < dt_min <= dt_max"),
    (dict(dt_min=0.0), r"expected 0 < dt_min <= dt_max, got dt_min=0.0"),
    (dict(a_init_min=0.0), r"expected 0 < a_init_min <= a_init_max, got a_init_min=0.0"),
    (dict(a_init_min=4.0, a_init_max=2.0), r"expected 0 < a_init_min <= a_init_max"),
    (dict(head_dim=4), r"unknown option\(s\) \['head_dim'\]"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=r"layers\[0\] \('mamba2'\).*" + message):
        ModelConfig(layers=(layer("mamba2", **options),), d_model=16)


def test_presets_and_block_are_registered():
    """(What `hybrid-jax list` prints from these registries is tested once, in test_cli.)"""
    assert "mamba2" in block_names()
    assert {"mamba2-tiny", "mamba2-hybrid-tiny", "mamba2-130m"} <= set(presets.names())


def test_130m_preset_size():
    """~130M parameters (counted on 1 and 2 of its 24 identical layers: tracing is slow)."""
    config = presets.get("mamba2-130m")
    assert len(config.layers) == 24 and len(set(config.layers)) == 1

    def count(num_layers):
        short = config.replace(layers=config.layers[:num_layers])
        return hj.count_params(nnx.eval_shape(lambda: hj.LanguageModel(short, rngs=nnx.Rngs(0))))

    one = count(1)
    assert 125e6 < one + 23 * (count(2) - one) < 135e6


def test_init_ranges(mixer):
    dt = jax.nn.softplus(mixer.dt_bias[...])
    assert mixer.dt_bias.shape == (8,)
    assert bool(jnp.all((dt >= 0.001 * 0.999) & (dt <= 0.1 * 1.001)))
    assert bool(jnp.all((-mixer.A_log[...] <= 0) & (mixer.A_log[...] <= np.log(16))))
    assert bool(jnp.all(mixer.D[...] == 1))


def test_init_follows_its_options():
    """The init draws from the options' ranges: a one-point A range gives A_log = log of it;
    a (one-point) dt range below `dt_init_floor` is raised to the floor."""
    options = dict(ssm_head_dim=4, state_size=8, n_groups=2, chunk_size=4)
    pinned = first_mixer(small_config(layer("mamba2", **options, a_init_min=3.0, a_init_max=3.0,
                                            dt_min=1e-5, dt_max=1e-5, dt_init_floor=2e-4)))
    assert_close(pinned.A_log[...], np.full(8, np.log(3.0)), 1e-6, "A_log")
    assert_close(jax.nn.softplus(pinned.dt_bias[...]), np.full(8, 2e-4), 1e-3, "dt floored")
    # The defaults are mamba_ssm's: A ~ U[1, 16], dt log-uniform in [0.001, 0.1]; 64 heads
    # reach near both ends of each range.
    wide = first_mixer(ModelConfig(layers=(layer("mamba2", ssm_head_dim=2, state_size=8),),
                                   vocab_size=32, d_model=64, num_heads=2))
    a, dt = np.exp(np.asarray(wide.A_log[...])), np.asarray(jax.nn.softplus(wide.dt_bias[...]))
    assert a.shape == dt.shape == (64,)
    assert 1 <= a.min() < 2 and 15 < a.max() <= 16, (a.min(), a.max())
    assert 1e-3 * 0.999 <= dt.min() < 1.5e-3 and 0.07 < dt.max() <= 0.1 * 1.001, dt
