"""NHA block: the layer against a numpy per-token loop of its equations, decode equals the
parallel pass, packed documents stay apart, with_window."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from tests.helpers import assert_close, assert_init_stds, assert_packed_documents_isolated, normals
from tests.nn.test_attention import project_biased
from tests.nn.test_gated_deltanet import (
    check_prefill_in_pieces,
    jitted_mixer,
    param,
    project,
    rms,
    short_conv,
    silu,
)
from tests.nn.test_lm import check_decode_matches
from tests.ops.test_attention import numpy_rope
from tests.ops.test_nha import numpy_nha

SMALL = dict(vocab_size=32, d_model=16, num_heads=2)


def nha_reference(mixer, x, eps, *, window, tau, theta, fraction):
    """The NHA layer (module docstring) in float64 numpy, one document a row: projections, SiLU
    short convs, swish slot features, RoPE on the window branch, silu values, gates
    logsigmoid(W_f x)/τ and s = 1 − e^g, the op's per-token loop
    (`tests/ops/test_nha.numpy_nha`), W_o·RMSNorm(silu(o))."""
    q, k, v = (short_conv(project_biased(x, proj), conv) for proj, conv in (
        (mixer.q_proj, mixer.q_conv), (mixer.k_proj, mixer.k_conv), (mixer.v_proj, mixer.v_conv)))
    g = -np.logaddexp(0.0, -project(x, mixer.f_proj)) / tau  # logsigmoid / τ, [B, T, G, M]
    positions = np.arange(x.shape[1])  # the window logits see relative positions only
    out, _ = numpy_nha(silu(q), silu(k), silu(v), 1.0 - np.exp(g), g, window,
                       q.shape[-1] ** -0.5, q_window=numpy_rope(q, positions, theta, fraction),
                       k_window=numpy_rope(k, positions, theta, fraction))
    normed = rms(silu(out).reshape(*out.shape[:2], -1), eps) * param(mixer.o_norm.scale)
    return np.tensordot(normed.reshape(out.shape), param(mixer.o_proj.kernel), axes=2)


@pytest.mark.parametrize("window, options", [
    (3, {}), (0, {}), (20, {}),
    (2, dict(num_heads=1, num_kv_heads=1, num_slots=1, chunk_size=1, conv_size=1,
             gate_logit_normalizer=0.5, head_dim=6)),
], ids=["w3", "w0", "w20", "smallest"])
def test_layer_matches_numpy_per_token_loop(window, options):
    """Chunked forward (chunk 4, T = 11) against the equations: grouped kv heads, short convs,
    half-rotary RoPE at a non-default base, a non-default gate normaliser; windows shorter
    than a chunk, 0 (slots only) and past T (causal attention, the slots never written); and
    the smallest legal sizes (one head, one slot, chunks and convs of 1, τ < 1, a head dim
    of its own). Projections of std 0.5, so that the logits are O(1) and every input moves
    the softmax."""
    options = {"num_heads": 4, "num_kv_heads": 2, "num_slots": 3, "chunk_size": 4,
               "gate_logit_normalizer": 4.0, **options}
    cfg = ModelConfig(layers=(layer("nha", window=window, short_conv=True, rope_theta=500.0,
                                    rope_fraction=0.5, **options),),
                      vocab_size=8, d_model=16, num_heads=2, init_std=0.5)
    mixer, forward = jitted_mixer(cfg)
    heads, dim = options["num_heads"], options.get("head_dim", 16 // options["num_heads"])
    assert mixer.q_proj.kernel.shape == (16, heads, dim)
    x = normals(0, (2, 11, 16), dtype=np.float32)
    expected = nha_reference(mixer, np.asarray(x, np.float64), cfg.norm_eps, window=window,
                             tau=options["gate_logit_normalizer"], theta=500.0, fraction=0.5)
    assert_close(forward(x, None), expected, 2e-6)


def test_head_dim_biases_conv_size_and_norm_eps_of_their_own():
    """An explicit head size frees num_heads from d_model (3 query heads of 4 on d_model 16,
    one kv head), q, k, v biases (set to random values here: they start at zero; the slot
    gates have none) enter both branches, `conv_size` 2 sets the short convs' taps and the
    output norm takes the model's `norm_eps` (1e-1: large enough to move the output)."""
    cfg = ModelConfig(layers=(layer("nha", num_heads=3, num_kv_heads=1, head_dim=4, window=2,
                                    num_slots=3, chunk_size=4, short_conv=True, conv_size=2,
                                    qkv_bias=True, rope_fraction=0.5),),
                      vocab_size=8, d_model=16, num_heads=2, init_std=0.5, norm_eps=1e-1)
    mixer = hj.create_model(cfg).blocks[0].mixer
    assert mixer.q_proj.kernel.shape == (16, 3, 4) and mixer.f_proj.bias is None
    assert [c.weight.shape for c in (mixer.q_conv, mixer.k_conv, mixer.v_conv)] == [
        (2, 12), (2, 4), (2, 4)]
    for seed, proj in enumerate((mixer.q_proj, mixer.k_proj, mixer.v_proj)):
        proj.bias[...] = jnp.asarray(normals(10 + seed, proj.bias.shape, dtype=np.float32))
    x = normals(0, (2, 9, 16), dtype=np.float32)
    expected = nha_reference(mixer, np.asarray(x, np.float64), 1e-1, window=2, tau=8.0,
                             theta=10000.0, fraction=0.5)
    assert_close(mixer(x, TokenContext.create(x.shape[:2])), expected, 2e-6)


@pytest.mark.parametrize("window, max_len, ring", [(3, 9, 3), (12, 5, 5), (None, 7, 7)])
def test_cache_rings_the_window_in_the_cache_dtype_and_keeps_float32_slots(window, max_len,
                                                                           ring):
    cfg = ModelConfig(layers=(layer("nha", num_slots=4, window=window, num_kv_heads=1),),
                      **SMALL)
    state = hj.create_model(cfg).blocks[0].mixer.init_cache(2, max_len, jnp.bfloat16).state
    assert state.keys.shape == state.values.shape == (2, ring, 1, 8)
    assert state.keys.dtype == state.values.dtype == jnp.bfloat16
    assert state.slot_keys.shape == (2, 1, 8, 4) and state.slot_keys.dtype == jnp.float32


def test_projections_start_at_init_std_and_the_output_at_its_residual_scale():
    """q, k, v, f at `init_std`; W_o, which writes into the residual stream, at
    init_std / √(2·num_layers) (GPT-2): here 0.4 / √4 with two layers."""
    cfg = ModelConfig(layers=(layer("nha", num_slots=16),) * 2, vocab_size=8, d_model=64,
                      num_heads=2, init_std=0.4)
    mixer = hj.create_model(cfg).blocks[0].mixer
    stds = dict.fromkeys(("q_proj", "k_proj", "v_proj", "f_proj"), 0.4)
    assert_init_stds(mixer, {**stds, "o_proj": 0.2}, rtol=0.1)  # ≥ 2048 draws


def test_decode_matches_parallel_past_the_window():
    """Window 3 with short convs and grouped kv heads (the ring wraps, tokens move into the
    slots, before and after a prefill), window 0 (slots only) and a full window with sinks."""
    config = ModelConfig(layers=(
        layer("nha", num_slots=4, window=3, short_conv=True, num_kv_heads=1),
        layer("nha", num_slots=4, window=0),
        layer("nha", num_slots=4, window=None, empty_slots="sink"),
    ), **SMALL)
    check_decode_matches(config, T=11, splits=(0, 7))


def test_prefill_in_pieces_continues_the_slots_and_the_ring():
    """Later multi-token prefills continue the slots and the window's ring through the chunked
    form (window 3 with short convs and sinks, window 0)."""
    config = ModelConfig(layers=(
        layer("nha", num_slots=4, window=3, short_conv=True, empty_slots="sink"),
        layer("nha", num_slots=4, window=0),
    ), init_std=0.5, **SMALL)
    check_prefill_in_pieces(config)


def _forward(model):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda s, t, **kw: nnx.merge(graphdef, s)(t, **kw)), state


def test_packed_documents_do_not_leak():
    """Logits of a packed second document equal those of the document alone: its window
    starts at the document and its slots start empty (window 2 < document length)."""
    config = ModelConfig(layers=(layer("nha", num_slots=4, window=2, short_conv=True),) * 2,
                         **SMALL)
    assert_packed_documents_isolated(hj.create_model(config, seed=2))


def test_with_window_shares_parameters_and_matches_a_model_built_with_it():
    config = ModelConfig(layers=(layer("nha", num_slots=4), "gsa"), window=8, **SMALL)
    model = hj.create_model(config, seed=1)
    for window, layers in ((2, None), (None, [0])):
        changed = model.with_window(window, layers=layers)
        assert changed.blocks[0].mixer.window == window
        assert changed.config.block_options(0).window == window
        assert changed.embed.table[...] is model.embed.table[...]  # nothing copied
    assert model.blocks[0].mixer.window == 8  # the original is unchanged
    # The changed model computes what a model built with its config (same seed: same
    # parameters) computes, and differs from the original.
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 12)), jnp.int32)
    changed = model.with_window(2)
    logits = [forward(state, tokens) for forward, state in map(_forward, (
        changed, hj.create_model(changed.config, seed=1), model))]
    assert_close(logits[0], logits[1], 1e-6, "with_window(2)")
    assert float(jnp.max(jnp.abs(logits[0] - logits[2]))) > 1e-3


def test_with_window_errors_name_the_problem():
    model = hj.create_model(ModelConfig(layers=(layer("nha", num_slots=4), "attention"),
                                        window=4, **SMALL))
    with pytest.raises(ValueError, match=r"layer 5 has no window option; layers with one: "
                                         r"\[0, 1\]"):
        model.with_window(2, layers=[5])
    with pytest.raises(ValueError, match="attention needs window >= 1"):
        model.with_window(0)
    assert model.with_window(0, layers=[0]).blocks[0].mixer.window == 0


@pytest.mark.parametrize("options, message", [
    (dict(window=-1), "window=-1: expected an integer >= 0"),
    (dict(feature_map="relu"), "feature_map='relu': expected one of"),
    (dict(empty_slots="zero"), "empty_slots='zero': expected one of"),
    (dict(chunk_size=24), "chunk_size=24: expected a power of two"),
    (dict(num_kv_heads=3), "num_kv_heads=3 does not divide num_heads=2"),
    (dict(num_heads=3), r"num_heads=3 does not divide d_model=16 \(set head_dim\)"),
    (dict(num_slots=0), r"num_slots=0: expected a positive integer"),
    (dict(num_kv_heads=0), r"num_kv_heads=0: expected a positive integer or None"),
    (dict(head_dim=0), r"head_dim=0: expected a positive integer or None"),
    (dict(gate_logit_normalizer=0.0), r"gate_logit_normalizer=0.0: expected a positive number"),
    (dict(value_activation="gelu"), r"value_activation='gelu': expected one of \['identity', "
                                    r"'silu'\]"),
    (dict(feature_map="relu"), r"expected one of \['identity', 'swish'\]"),
    (dict(rope_fraction=1.5), r"rope_fraction must be in \[0, 1\], got 1.5"),
    (dict(rope_scaling=(0.0, 1.0, 4.0, 8192)),
     r"NHAOptions.rope_scaling=\(0.0, 1.0, 4.0, 8192\): .* factor > 0"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(layers=(layer("nha", **options),), **SMALL)
