"""Oryx: all-attention / all-linear equal the single mixers with the same weights, mixed modes
decode exactly like the parallel pass (values and gradients), both modes' parameters learn."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.attention import AttentionOptions
from hybrid_jax.nn.gated_deltanet import GatedDeltaNetMixer, GatedDeltaNetOptions
from hybrid_jax.nn.mamba2 import Mamba2Mixer, Mamba2Options
from hybrid_jax.nn.oryx import MODE, OryxMixer, OryxOptions, shared_fraction
from tests.helpers import assert_close, normals

# GDN: 2 heads of 8. Mamba-2: d_inner 32 as 8 value heads of 4, 2 groups of B/C (state 8):
# the attention mode's 2 heads, each over 4 value heads.
LAYERS = {"gdn": layer("oryx", chunk_size=4),
          "mamba2": layer("oryx", linear_mixer="mamba2", ssm_head_dim=4, state_size=8,
                          n_groups=2, chunk_size=4)}
CONFIGS = {kind: ModelConfig(layers=(spec,) * 2, vocab_size=32, d_model=16, num_heads=2)
           for kind, spec in LAYERS.items()}
CONFIG = CONFIGS["gdn"]
KINDS = list(LAYERS)
T = 7  # chunks of 4: switches below fall on a chunk edge (4) and mid-chunk (2, 5, 6)
MODES = np.array([[0, 0, 1, 1, 0, 1, 1],
                  [1, 1, 1, 1, 0, 0, 1]], np.int32)


def mixer_and_input(kind="gdn", seed=0):
    options = CONFIGS[kind].block_options(0)
    mixer = OryxMixer(CONFIGS[kind], options, rngs=nnx.Rngs(seed))
    x = normals(seed, (2, T, 16), dtype=np.float32)
    return mixer, options, x


def ctx_with(mode):
    return TokenContext.create((2, T), extras={MODE: jnp.asarray(mode, jnp.int32)})


@pytest.mark.parametrize("kind", KINDS)
def test_all_linear_equals_the_linear_mixer(kind):
    mixer, options, x = mixer_and_input(kind)
    single = {"gdn": GatedDeltaNetMixer, "mamba2": Mamba2Mixer}[kind](
        CONFIGS[kind], options.linear_options(), rngs=nnx.Rngs(5))
    nnx.update(single, nnx.state(mixer.linear))
    ctx = ctx_with(np.zeros((2, T)))
    assert_close(mixer(x, ctx), single(x, TokenContext.create((2, T))), 1e-6, "all-linear")


@pytest.mark.parametrize("default_mode,modes", [("attention", np.ones((2, T))),
                                                ("linear", np.zeros((2, T)))])
def test_a_context_without_modes_runs_the_default_mode(default_mode, modes):
    """No "mode" extra: every token in `default_mode` (attention unless set)."""
    options = dataclasses.replace(CONFIG.block_options(0), default_mode=default_mode)
    mixer = OryxMixer(CONFIG, options, rngs=nnx.Rngs(0))
    x = normals(0, (2, T, 16), dtype=np.float32)
    plain = mixer(x, TokenContext.create((2, T)))
    assert_close(plain, mixer(x, ctx_with(modes)), 1e-6, default_mode)
    assert not np.allclose(plain, mixer(x, ctx_with(1 - modes)), atol=1e-3)


def test_defaults_are_the_linear_mixers_and_attentions_own():
    """An Oryx layer's modes are its mixers as they default, except GDN's value width: Oryx keeps
    attention-sized values (`expand_v` 1, module docstring) where GDN's default is its paper's 2."""
    assert OryxOptions(linear_mixer="mamba2").linear_options() == Mamba2Options()
    assert OryxOptions().linear_options() == dataclasses.replace(GatedDeltaNetOptions(),
                                                                 expand_v=1)
    assert OryxOptions().attention_options() == AttentionOptions()


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_modes_pick_each_tokens_output_of_its_mode(kind):
    """Every token's key and value enter both the KV cache and the linear state whatever its
    mode, so a mixed schedule's output at t is the all-attention output at t or the all-linear
    one (each mode's own sequence model over all tokens), per token: switches mid-chunk and
    on a chunk edge."""
    mixer, _, x = mixer_and_input(kind)
    attention = mixer(x, ctx_with(np.ones((2, T))))
    linear = mixer(x, ctx_with(np.zeros((2, T))))
    expected = np.where(MODES[..., None] == 1, attention, linear)
    assert_close(mixer(x, ctx_with(MODES)), expected, 1e-5, "mixed")
    assert not np.allclose(attention, linear, atol=1e-3)  # so a wrong pick would show


def causal_softmax_attention(q, k, v):
    """Causal softmax attention of `[B,T,G,K]` q, k over `[B,T,G,V]` v (one head per group)."""
    logits = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    logits = jnp.where(np.tril(np.ones((T, T), bool)), logits, -jnp.inf)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, axis=-1), v)


def test_all_attention_equals_softmax_attention_on_the_shared_keys_and_values():
    """GDN mode, written out: RoPE'd W_Q^att x against RoPE'd shared keys, causal softmax."""
    mixer, _, x = mixer_and_input()
    ctx = ctx_with(np.ones((2, T)))
    lin = mixer.linear
    k = lin.k_conv(lin.k_proj(x).reshape(2, T, -1), None).reshape(2, T, 2, 8)
    v = lin.v_conv(lin.v_proj(x).reshape(2, T, -1), None).reshape(2, T, 2, 8)
    k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + 1e-6)  # GDN's eps
    rope, positions = mixer.attention.rope, ctx.positions
    q, k = rope(mixer.attention.q_proj(x), positions), rope(k, positions)
    o = causal_softmax_attention(q, k, v)
    assert_close(mixer(x, ctx), lin.output(o, x), 1e-6, "all-attention")


def test_all_attention_mamba2_is_one_head_per_group_over_its_value_heads():
    """Mamba-2 mode, written out: keys B (conv, SiLU), values x; group g's attention pattern
    weights the values of heads 4g..4g+3; no D skip; Mamba-2's gated norm and out_proj."""
    mixer, _, x = mixer_and_input("mamba2")
    ctx = ctx_with(np.ones((2, T)))
    lin = mixer.linear
    keys = lin.b_conv(lin.b_proj(x).reshape(2, T, -1), None).reshape(2, T, 2, 8)
    values = lin.x_conv(lin.x_proj(x).reshape(2, T, -1), None).reshape(2, T, 8, 4)
    rope, positions = mixer.attention.rope, ctx.positions
    q, keys = rope(mixer.attention.q_proj(x), positions), rope(keys, positions)
    heads = [causal_softmax_attention(q[:, :, g:g + 1], keys[:, :, g:g + 1],
                                      values[:, :, 4 * g + h:4 * g + h + 1])
             for g in range(2) for h in range(4)]
    o = jnp.concatenate(heads, axis=2)
    assert_close(mixer(x, ctx), lin.output(o, x), 1e-6, "all-attention")


def decode_tokens(model, tokens, modes, split):
    """Logits of a prefill of `split` tokens then one token at a time, with the given modes."""
    cache = model.init_cache(2, T)
    out = []
    if split:
        logits, cache = model.decode(tokens[:, :split], cache,
                                     extras={MODE: modes[:, :split]})
        out.append(logits)
    for t in range(split, T):
        logits, cache = model.decode(tokens[:, t:t + 1], cache,
                                     extras={MODE: modes[:, t:t + 1]})
        out.append(logits)
    return jnp.concatenate(out, axis=1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("split", [0, 5])
def test_mixed_modes_decode_equals_parallel_values_and_gradients(kind, split):
    """Token by token (split 0: the one-token steps, values), and a prefill of 5 (the chunked
    form with a carried state and the cache) then steps (values and gradients)."""
    model = hj.create_model(CONFIGS[kind], seed=1)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, T)), jnp.int32)
    modes = jnp.asarray(MODES)
    weights = normals(3, (2, T, 32), dtype=np.float32)
    graphdef, state = nnx.split(model)

    def parallel(state):
        logits = nnx.merge(graphdef, state)(tokens, extras={MODE: modes})
        return jnp.sum(weights * logits), logits

    def decoded(state):
        logits = decode_tokens(nnx.merge(graphdef, state), tokens, modes, split)
        return jnp.sum(weights * logits), logits

    # Jitted: one compile each, not one per op of every decode step.
    if split:
        (_, logits), grads = jax.jit(jax.value_and_grad(decoded, has_aux=True))(state)
        (_, expected), expected_grads = jax.jit(jax.value_and_grad(parallel, has_aux=True))(state)
        assert_close(grads, expected_grads, 1e-5, "gradients")
    else:
        logits, expected = (jax.jit(lambda s, f=f: f(s)[1])(state) for f in (decoded, parallel))
    assert_close(logits, expected, 1e-5, "logits")


# Per mode: the query of each mode, a small linear-mode parameter, a shared projection.
PROBES = {"gdn": {"q_att": "attention.q_proj", "q_lin": "linear.q_proj",
                  "small": "linear.b_proj", "k": "linear.k_proj"},
          "mamba2": {"q_att": "attention.q_proj", "q_lin": "linear.c_proj",
                     "small": "linear.dt_proj", "k": "linear.b_proj"}}


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_both_modes_and_only_the_modes_used(kind):
    model = hj.create_model(CONFIGS[kind], seed=1)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, T)), jnp.int32)
    graphdef, state = nnx.split(model)

    grad = jax.jit(jax.grad(lambda s, modes: jnp.sum(nnx.merge(graphdef, s)(
        tokens, extras={MODE: modes}) ** 2)))

    def norms(modes):
        grads = grad(state, jnp.asarray(modes))
        mixer = nnx.merge(graphdef, grads).blocks[0].mixer
        parts = {name: functools.reduce(getattr, path.split("."), mixer)
                 for name, path in PROBES[kind].items()}
        return {name: float(jnp.linalg.norm(part.kernel[...])) for name, part in parts.items()}

    mixed = norms(MODES)
    assert min(mixed.values()) > 0, mixed
    linear_only = norms(np.zeros_like(MODES))
    assert linear_only["q_att"] == 0 and linear_only["q_lin"] > 0, linear_only
    attention_only = norms(np.ones_like(MODES))
    assert attention_only["q_lin"] == 0 and attention_only["small"] == 0, attention_only


def test_modes_and_options_are_checked():
    mixer, _, x = mixer_and_input()
    with pytest.raises(ValueError, match="expected modes 0"):
        mixer(x, ctx_with(np.full((2, T), 2)))
    with pytest.raises(ValueError, match="linear_mixer"):
        OryxOptions(linear_mixer="mamba3")
    with pytest.raises(ValueError, match=r"\['state_size'\] do not apply to linear_mixer='gdn'"):
        OryxOptions(state_size=16)
    with pytest.raises(ValueError, match=r"\['expand_v'\] do not apply to linear_mixer='mamba2'"):
        OryxOptions(linear_mixer="mamba2", expand_v=2)
    with pytest.raises(ValueError, match=r"AttentionOptions.rope_scaling=\(8.0, 1.0, 4.0, -1\)"):
        ModelConfig(layers=(layer("oryx", rope_scaling=(8.0, 1.0, 4.0, -1)),), vocab_size=8,
                    d_model=16, num_heads=2)


@pytest.mark.parametrize("name, block, model", [("oryx-gdn-tiny", 0.857, 0.874),
                                                ("oryx-mamba2-tiny", 0.909, 0.920)])
def test_shared_fraction_of_the_tiny_presets(name, block, model):
    built = nnx.eval_shape(lambda: hj.LanguageModel(presets.get(name), rngs=nnx.Rngs(0)))
    assert shared_fraction(built.blocks[0]) == pytest.approx(block, abs=1e-3)
    assert shared_fraction(built) == pytest.approx(model, abs=1e-3)


def test_decode_cache_holds_both_states_and_reports_its_bytes():
    """2 layers: a KV cache of 7 positions × 2 heads × (8 + 8) float32 per row, plus the
    linear mixer's state and conv inputs; the Mamba-2 mode's values are 4 heads of 4 per
    key head (16 wide)."""
    from hybrid_jax.cache import decode_cache_bytes

    for kind in KINDS:
        model = nnx.eval_shape(lambda kind=kind: hj.LanguageModel(CONFIGS[kind],
                                                                  rngs=nnx.Rngs(0)))
        sizes = decode_cache_bytes(model, 2, T)
        assert sizes["cache_kv_bytes"] == 2 * (2 * T * 2 * (8 + {"gdn": 8, "mamba2": 16}[kind])
                                               * 4 + T * 4), (kind, sizes)
        assert sizes["cache_state_bytes"] > 0
        assert sizes["cache_bytes"] == sizes["cache_kv_bytes"] + sizes["cache_state_bytes"]


def test_decode_cache_bytes_of_a_scanned_model_are_its_unscanned_forms():
    """A scanned model cannot decode (`init_cache` refuses it); its cache's bytes are those of
    the same model unscanned (an evaluation of a `--scan-layers` run reports them)."""
    from hybrid_jax.cache import decode_cache_bytes

    config = CONFIGS["gdn"]
    sizes = [decode_cache_bytes(nnx.eval_shape(lambda scan=scan: hj.LanguageModel(
        config.replace(scan_layers=scan), rngs=nnx.Rngs(0))), 2, T) for scan in (False, True)]
    assert sizes[0] == sizes[1] and sizes[0]["cache_kv_bytes"] > 0


def test_cache_bytes_count_each_array_at_its_own_width():
    """A bfloat16 KV cache (a model computing in bfloat16) counts 2 bytes a value, beside its
    int32 positions' 4."""
    from hybrid_jax.cache import AttentionCache, cache_nbytes

    kv = np.zeros((2, 3, 1, 4), jnp.bfloat16)
    cache = AttentionCache(keys=kv, values=kv, positions=np.zeros(3, np.int32))
    assert cache_nbytes(cache) == 2 * (2 * 3 * 4) * 2 + 3 * 4


def test_schedules_for_training_and_inference():
    from hybrid_jax.config import ModeSchedule
    from hybrid_jax.modes import batch_modes, inference_modes, training_modes

    schedule = ModeSchedule(pattern="random_chunks", chunk=3, attention_prob=0.5)
    a = np.asarray(training_modes(schedule, (4, 8), 0, 7))
    assert (a == np.asarray(training_modes(schedule, (4, 8), 0, 7))).all()
    assert (a[:, :3] == a[:, :1]).all() and (a[:, 3:6] == a[:, 3:4]).all()
    assert 0 < a.mean() < 1
    # A fresh draw each step and seed (12 chunks: equal draws by chance have odds 2^-12).
    draws = [np.asarray(training_modes(schedule, (4, 9), seed, step)) for seed, step in
             ((0, 7), (0, 8), (1, 7))]
    assert not (draws[0] == draws[1]).all() and not (draws[0] == draws[2]).all()
    assert (np.asarray(training_modes(ModeSchedule(pattern="linear"), (1, 3), 0, 0)) == 0).all()
    assert training_modes(ModeSchedule(), (1, 3), 0, 0) is None
    modes = inference_modes("prefill=linear,decode=attention", [2, 3], 5)
    assert modes.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match="prefill=MODE"):
        inference_modes("prefill=linear", [2], 4)
    with pytest.raises(ValueError, match="pattern"):
        ModeSchedule(pattern="mixed")
    mask = np.array([[0, 1, 0, 1]], bool)
    assert batch_modes("scored=attention,other=linear", mask).tolist() == [[0, 1, 0, 1]]
    assert batch_modes("linear", mask).tolist() == [[0, 0, 0, 0]]
    with pytest.raises(ValueError, match="expected 'scored=MODE,other=MODE'"):
        batch_modes("queries=attention", mask)


def test_mode_schedules_exact_values_and_errors():
    """Each schedule's exact modes, int32 and `[B, T]` with a short last chunk; the batch key
    the blocks read; a bad part, mode or explicit array is named with what was expected."""
    from hybrid_jax.config import ModeSchedule
    from hybrid_jax.context import EXTRA_PREFIX
    from hybrid_jax.modes import batch_modes, inference_modes, training_modes, with_modes

    chunks = ModeSchedule(pattern="random_chunks", chunk=3, attention_prob=0.5)
    a = np.asarray(training_modes(chunks, (4, 8), 0, 7))
    assert a.shape == (4, 8) and a.dtype == np.int32
    assert (a[:, 6:8] == a[:, 6:7]).all()  # the last chunk: 2 tokens, one draw
    for prob in (0.0, 1.0):  # the schedule's probability, not a fixed one
        drawn = training_modes(ModeSchedule(pattern="random_chunks", chunk=3,
                                            attention_prob=prob), (4, 8), 0, 7)
        assert np.asarray(drawn).tolist() == [[int(prob)] * 8] * 4
    attention = np.asarray(training_modes(ModeSchedule(pattern="attention"), (2, 3), 0, 0))
    assert attention.tolist() == [[1, 1, 1]] * 2
    batch = {"inputs": np.zeros((2, 8), np.int32)}
    moded, key = with_modes(batch, chunks, 0, 7), f"{EXTRA_PREFIX}{MODE}"  # the blocks' extra
    assert sorted(moded) == sorted([key, "inputs"])
    assert (np.asarray(moded[key]) == np.asarray(training_modes(chunks, (2, 8), 0, 7))).all()
    assert with_modes(batch, ModeSchedule(), 0, 7) is batch

    mask = np.array([[0, 1, 0, 1]], bool)
    assert batch_modes("scored=attention,other=linear", mask).dtype == np.int32
    assert batch_modes("attention", mask).tolist() == [[1, 1, 1, 1]]
    with pytest.raises(ValueError, match=r"mode schedule 'sparse': scored mode 'sparse' is not "
                                         r"one of \['linear', 'attention'\]"):
        batch_modes("sparse", mask)
    with pytest.raises(ValueError, match=r"decode mode 'fast' is not one of"):
        inference_modes("prefill=linear,decode=fast", [2], 4)
    with pytest.raises(ValueError, match="expected 'prefill=MODE,decode=MODE'"):
        inference_modes("prefill=linear,decode=attention,draft=linear", [2], 4)
    with pytest.raises(ValueError, match="expected 'scored=MODE,other=MODE'"):  # a part twice
        batch_modes("scored=attention,other=linear,scored=linear", mask)
    explicit = inference_modes(np.array([[0, 1, 1]], bool), [1], 3)
    assert explicit.tolist() == [[0, 1, 1]] and explicit.dtype == np.int32
    with pytest.raises(ValueError, match=r"expected \[batch, prompt \+ new tokens\] = \[1, 4\] "
                                         r"of 0/1, got shape \[1, 3\] of \[0\]"):
        inference_modes(np.zeros((1, 3), np.int32), [1], 4)
    with pytest.raises(ValueError, match=r"= \[1, 3\] of 0/1, got shape \[1, 3\] of \[0, 1, 2\]"):
        inference_modes(np.array([[0, 2, 1]]), [1], 3)


def test_a_schedule_does_not_silently_replace_the_modes_a_batch_has():
    """A batch that carries its modes (e.g. `evaluate(..., modes=...)` given a step made with
    a training schedule) had them replaced by the schedule's: the step ran other modes than
    those asked for (and reported). "none" adds nothing, so it keeps them."""
    from hybrid_jax.config import ModeSchedule
    from hybrid_jax.context import EXTRA_PREFIX
    from hybrid_jax.modes import with_modes

    batch = {"inputs": np.zeros((1, 4), np.int32), f"{EXTRA_PREFIX}{MODE}": np.ones((1, 4))}
    with pytest.raises(ValueError, match=r"mode schedule 'linear': the batch has its own modes "
                                         r"\('extra.mode'\)"):
        with_modes(batch, ModeSchedule(pattern="linear"), 0, 0)
    assert with_modes(batch, ModeSchedule(), 0, 0) is batch


@pytest.mark.parametrize("lengths", [[6, 1], [0, 2], [-1, 2], [[1, 2]], [1.5, 2]],
                         ids=["past-the-row", "empty", "negative", "2d", "float"])
def test_inference_modes_refuses_prompt_lengths_outside_the_row(lengths):
    """A prompt longer than the row made every token prefill, a negative or empty one every
    token decode, a float one was compared as is: all silently; now each is named."""
    from hybrid_jax.modes import inference_modes

    with pytest.raises(ValueError, match=r"inference_modes: expected \[batch\] integer prompt "
                                         r"lengths in \[1, 5\], got"):
        inference_modes("prefill=linear,decode=attention", lengths, 5)


def test_generate_takes_a_mode_schedule():
    from hybrid_jax.generate import generate

    model = hj.create_model(CONFIG, seed=1)
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 4)), jnp.int32)
    default = np.asarray(generate(model, prompt, 3))
    assert (np.asarray(generate(model, prompt, 3, modes="attention")) == default).all()
    linear = np.asarray(generate(model, prompt, 3, modes="linear"))
    explicit = np.zeros((2, 7), np.int32)
    assert (np.asarray(generate(model, prompt, 3, modes=explicit)) == linear).all()
    # Ragged prompts: each row's own prompt is its prefill (weights large enough that the
    # modes change the tokens).
    varied = hj.create_model(CONFIG.replace(init_std=0.3), seed=1)
    split = functools.partial(generate, varied, prompt, 3, lengths=[4, 2])
    by_row = np.asarray([[0] * 4 + [1] * 3, [0] * 2 + [1] * 5], np.int32)
    mixed = np.asarray(split(modes="prefill=linear,decode=attention"))
    assert (mixed == np.asarray(split(modes=by_row))).all()
    assert (mixed != np.asarray(split(modes=np.asarray([[0] * 4 + [1] * 3] * 2)))).any()


def test_generate_refuses_modes_beside_an_extras_mode_array():
    """`modes=` replaced the caller's `extras["mode"]` without a word: two schedules, one of
    them dropped."""
    from hybrid_jax.generate import generate

    model = hj.create_model(CONFIG, seed=1)
    prompt = jnp.zeros((1, 2), jnp.int32)
    with pytest.raises(ValueError, match=r"either as modes= or as extras\['mode'\], not both"):
        generate(model, prompt, 2, modes="linear", extras={MODE: jnp.ones((1, 4), jnp.int32)})


@pytest.mark.parametrize("kind", KINDS)
def test_packed_documents_equal_each_document_alone(kind):
    """Two documents a row (ids and positions restarting at each), mixed modes: each document's
    outputs are those of the mixer on that document alone, both modes (the linear state and
    the convolutions reset, attention stays within the document)."""
    mixer, _, x = mixer_and_input(kind)
    lengths = [(3, 4), (5, 2)]  # a boundary mid-chunk and one on a chunk edge's other side
    segment_ids = np.array([sum(([d] * n for d, n in enumerate(row)), []) for row in lengths],
                           np.int32)
    positions = np.array([sum((list(range(n)) for n in row), []) for row in lengths], np.int32)
    ctx = TokenContext.create((2, T), positions=jnp.asarray(positions),
                              segment_ids=jnp.asarray(segment_ids),
                              extras={MODE: jnp.asarray(MODES)})
    packed = mixer(x, ctx)
    for b, row in enumerate(lengths):
        start = 0
        for n in row:
            alone = mixer(x[b:b + 1, start:start + n], TokenContext.create(
                (1, n), extras={MODE: jnp.asarray(MODES[b:b + 1, start:start + n])}))
            assert_close(packed[b:b + 1, start:start + n], alone, 1e-5,
                         f"{kind} row {b} document at {start}")
            start += n
