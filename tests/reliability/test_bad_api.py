"""Bad inputs to the Python API: token ids outside the vocabulary (concrete: ValueError; traced
inside jit: NaN logits, never a wrapped-around embedding), decoding past the cache's max_len,
sampling arguments, tokenizers, and an eval with nothing to score."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.cache import device_memory_bytes
from hybrid_jax.config import ModelConfig
from hybrid_jax.data.tokenizer import ByteTokenizer, WordTokenizer, train_bpe
from hybrid_jax.generate import generate
from hybrid_jax.nn.lm import create_model

VOCAB = 32


@pytest.fixture(scope="module")
def model():
    return create_model(ModelConfig(layers=("attention",), vocab_size=VOCAB, d_model=16,
                                    num_heads=2, ffn_dim=0))


@pytest.mark.parametrize("tokens, message", [
    ([[1, 32]], r"token id 32 at index \[0, 1\] is outside the vocabulary \[0, 32\) "
                r"\(ModelConfig.vocab_size\)$"),  # one bad id: no count
    ([[-1, 2]], r"token id -1 at index \[0, 0\] is outside the vocabulary"),
    ([[40, 50, 3]], r"token id 40 at index \[0, 0\] .* \(2 ids in all\)"),
])
def test_model_call_checks_concrete_ids(model, tokens, message):
    with pytest.raises(ValueError, match=message):
        model(jnp.asarray(tokens))


def test_model_call_refuses_float_tokens(model):
    with pytest.raises(ValueError, match=r"tokens must be an integer array \[batch, time\], "
                                         r"got shape \(1, 2\) dtype float32"):
        model(jnp.ones((1, 2)))


@pytest.mark.parametrize("shape", [(2, 0), (0, 3)])
def test_model_call_and_decode_refuse_empty_tokens(model, shape):
    tokens = jnp.zeros(shape, jnp.int32)
    for call in (model, lambda t: model.decode(t, model.init_cache(max(shape[0], 1), 4))):
        with pytest.raises(ValueError, match=r"tokens must hold at least one token per row and "
                                             rf"one row, got shape \({shape[0]}, {shape[1]}\)"):
            call(tokens)


def test_traced_ids_outside_the_vocabulary_give_nan_not_a_wrapped_row(model):
    tokens = jnp.asarray([[1, 2, 3], [1, -1, 3], [4, 5, VOCAB]])  # VOCAB: the first id past it
    logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    finite = np.isfinite(np.asarray(logits)).all(axis=-1)
    assert finite[0].all()
    assert not finite[1, 1:].any() and not finite[2, 2]  # the bad id and what follows it


def test_decode_refuses_to_pass_max_len(model):
    cache = model.init_cache(1, 4)
    _, cache = model.decode(jnp.asarray([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match=r"decoding 2 token\(s\) after 3 overflows the cache's "
                                         r"max_len=4.*windowed=True"):
        model.decode(jnp.asarray([[4, 5]]), cache)
    _, cache = model.decode(jnp.asarray([[4]]), cache)  # exactly full is fine


@pytest.mark.parametrize("jit", [False, True])
def test_decode_refuses_tokens_of_another_batch_than_the_cache(model, jit):
    """Each layer's state failed on its own (a concatenation TypeError, or a mixer naming one
    of its arrays); the batch is static, so jit refuses it too."""
    decode = nnx.jit(lambda m, t, c: m.decode(t, c)) if jit else (lambda m, t, c: m.decode(t, c))
    with pytest.raises(ValueError, match=r"decode: the tokens have batch 3, the cache was made "
                                         r"for batch 2 \(init_cache\(batch=3, ...\) for these\)"):
        decode(model, jnp.ones((3, 2), jnp.int32), model.init_cache(2, 4))


def test_decode_past_max_len_inside_jit_gives_nan(model):
    cache = model.init_cache(1, 2)
    step = nnx.jit(lambda m, t, c: m.decode(t, c))
    logits, cache = step(model, jnp.asarray([[1, 2]]), cache)
    assert np.isfinite(np.asarray(logits)).all()
    logits, _ = step(model, jnp.asarray([[3]]), cache)
    assert np.isnan(np.asarray(logits)).all()


def test_windowed_cache_may_decode_past_max_len(model):
    cache = model.init_cache(1, 2, windowed=True)
    logits, cache = model.decode(jnp.asarray([[1, 2, 3, 4]]), cache)
    assert np.isfinite(np.asarray(logits)).all() and int(cache.index) == 4


def test_windowed_cache_sees_the_last_max_len_tokens_however_the_tokens_are_split(model):
    """Past max_len, a windowed cache's full attention is a sliding window of max_len tokens
    (the model `with_window(max_len)`): a one-call decode attended to every token and a
    token-by-token decode to max_len + 1."""
    tokens = jnp.asarray([[3, 1, 4, 1, 5, 9]])
    want = np.asarray(model.with_window(2)(tokens))
    whole, _ = model.decode(tokens, model.init_cache(1, 2, windowed=True))
    np.testing.assert_allclose(np.asarray(whole), want, atol=1e-5)
    _, cache = model.decode(tokens[:, :3], model.init_cache(1, 2, windowed=True))
    for t in range(3, 6):
        logits, cache = model.decode(tokens[:, t:t + 1], cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), want[:, t], atol=1e-5)


def test_windowed_cache_refuses_positions_past_a_learned_table():
    """A windowed cache may pass max_len, not the learned position table: the logits were NaN."""
    learned = create_model(ModelConfig(layers=("attention",), vocab_size=VOCAB, d_model=16,
                                       num_heads=2, ffn_dim=0, position_embedding="learned",
                                       max_positions=4))
    _, cache = learned.decode(jnp.asarray([[1, 2, 3]]), learned.init_cache(1, 2, windowed=True))
    with pytest.raises(ValueError, match=r"decoding 2 token\(s\) after 3 needs positions up to "
                                         r"4, past the learned position table's "
                                         r"ModelConfig.max_positions=4"):
        learned.decode(jnp.asarray([[4, 5]]), cache)


def test_init_cache_refuses_a_dtype_that_is_not_floating(model):
    """Keys and values were cast to int8 and the logits came out silently wrong."""
    with pytest.raises(ValueError, match=r"init_cache: dtype must be a floating-point dtype "
                                         r"\(e.g. bfloat16, float32\), got int8"):
        model.init_cache(1, 4, jnp.int8)


def test_decode_checks_ids(model):
    with pytest.raises(ValueError, match="token id 77"):
        model.decode(jnp.asarray([[77]]), model.init_cache(1, 4))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), r"temperature must be a finite number >= 0 \(0: greedy\), got -1.0"),
    (dict(temperature=float("inf")), r"temperature must be a finite number >= 0"),
    (dict(top_k=0), r"top_k must be an integer in \[1, vocab_size=32\] or None, got 0"),
    (dict(top_k=33), r"top_k must be an integer in \[1, vocab_size=32\]"),
    (dict(top_k=2.5), r"top_k must be an integer"),
    (dict(seed=1.5), r"seed must be an integer, got 1.5"),
    (dict(max_len=3), r"max_len=3 is shorter than prompt \+ new tokens = 5"),
    (dict(eos_id=32), r"eos_id must be a token id in \[0, vocab_size=32\) or None, got 32"),
    (dict(eos_id=-1), r"eos_id must be a token id in \[0, vocab_size=32\) or None, got -1"),
    (dict(eos_id=1.0), r"eos_id must be a token id"),
    (dict(lengths=[1.5]), r"lengths must be \[batch=1\] integer prompt lengths in \[1, 2\], "
                          r"got \[1.5\]"),
    (dict(modes="attention"), r"modes: a mode schedule drives Oryx layers, and the model has "
                              r"none \(its layer types: \['attention'\]\)"),
])
def test_generate_arguments(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, jnp.asarray([[1, 2]]), 3, **kwargs)


@pytest.mark.parametrize("prompt, new, message", [
    ([[1, 32]], 3, r"prompt token id 32 at index \[0, 1\] is outside the vocabulary"),
    ([[-4]], 3, r"prompt token id -4"),
    ([[1, 2]], 0, r"max_new_tokens must be an integer >= 1, got 0"),
    ([1, 2], 3, r"prompt must be an integer array \[batch, time\] with time >= 1, got shape "
                r"\(2,\)"),
    (np.zeros((1, 2), np.float32), 3, r"prompt must be an integer array .* dtype float32"),
    ([[1, 2]], 10**12, r"the decode cache for batch 1 x 1000000000002 positions needs "
                       r"[0-9.]+ GiB; the device has [0-9.]+ GiB"),
])
def test_generate_prompts(model, prompt, new, message):
    with pytest.raises(ValueError, match=message):
        generate(model, prompt, new)


def test_generate_counts_a_learned_position_tables_length():
    """Without `max_positions`, the config's learned table sets the limit (positions past it
    have no embedding)."""
    learned = create_model(ModelConfig(layers=("attention",), vocab_size=VOCAB, d_model=16,
                                       num_heads=2, ffn_dim=0, position_embedding="learned",
                                       max_positions=4))
    with pytest.raises(ValueError, match="prompt of 2 tokens \\+ 3 new tokens is longer than "
                                         "the model's 4 positions"):
        generate(learned, jnp.asarray([[1, 2]]), 3)


def test_device_memory_is_the_allocators_limit_else_the_hosts():
    class Device:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    assert device_memory_bytes(Device({"bytes_limit": 5 * 2**30})) == 5 * 2**30
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert device_memory_bytes(Device(None)) == device_memory_bytes(Device({})) == host


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), WordTokenizer(["<eos>", "<unk>", "a"])],
                         ids=["byte", "word"])
@pytest.mark.parametrize("bad", [-1, 1000])
def test_tokenizer_decode_checks_ids(tokenizer, bad):
    with pytest.raises(ValueError, match=f"cannot decode token id {bad} with tokenizer "
                                         f"'{tokenizer.name}': expected ids in"):
        tokenizer.decode([1, bad])


def test_bpe_vocabulary_too_small():
    with pytest.raises(ValueError, match="a byte-level BPE needs vocab_size >= 258 .*got 257"):
        train_bpe(["some text"], 257)
    assert train_bpe(["some text"] * 4, 258).vocab_size <= 258


def test_eval_with_nothing_to_score_is_an_error():
    from hybrid_jax.config import ExperimentConfig, MeshConfig, TrainConfig
    from hybrid_jax.data.mqar import MQARConfig
    from hybrid_jax.sharding import make_mesh
    from hybrid_jax.train.trainer import evaluate, init_train_state

    experiment = ExperimentConfig(
        name="x", model=ModelConfig(layers=("attention",), d_model=16, num_heads=2, ffn_dim=0),
        data=MQARConfig(seq_len=16, num_kv_pairs=2), train=TrainConfig(mesh=MeshConfig(data=1)))
    ts = init_train_state(experiment, make_mesh(experiment.train.mesh))
    batch = {"inputs": np.ones((2, 16), np.int32), "targets": np.ones((2, 16), np.int32),
             "mask": np.zeros((2, 16), bool)}
    with pytest.raises(ValueError, match="the held-out set of 1 batches has no scored tokens"):
        evaluate(ts, [batch])
    batch["mask"][:, -1] = True
    assert evaluate(ts, [batch])["tokens"] == 2
    with pytest.raises(ValueError, match="eval modes: a mode schedule drives Oryx layers, and "
                                         "the model has none"):
        evaluate(ts, [batch], modes="linear")


def test_a_mode_schedule_for_a_model_without_oryx_is_refused(tmp_path):
    """A training mode schedule would be ignored by a model without Oryx layers: refused before
    anything compiles or is saved."""
    from hybrid_jax.config import ExperimentConfig, MeshConfig, ModeSchedule, TrainConfig
    from hybrid_jax.data.mqar import MQARConfig
    from hybrid_jax.train.trainer import train

    experiment = ExperimentConfig(
        name="x", model=ModelConfig(layers=("gdn", "attention"), d_model=16, num_heads=2,
                                    ffn_dim=0),
        data=MQARConfig(seq_len=16, num_kv_pairs=2),
        train=TrainConfig(steps=2, warmup_steps=1, mesh=MeshConfig(data=1),
                          mode_schedule=ModeSchedule(pattern="random_chunks")))
    with pytest.raises(ValueError, match=r"train.mode_schedule: .* the model has none \(its "
                                         r"layer types: \['attention', 'gdn'\]\)"):
        train(experiment, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()
