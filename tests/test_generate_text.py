"""Generation: greedy = argmax of repeated full forwards (ragged batches), seeded sampling,
top-p, EOS and stop strings, the text API and its one-line errors."""

import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.data.tokenizer import ByteTokenizer
from hybrid_jax.generate import _generate, generate, sample_token
from hybrid_jax.generate_text import TextGeneration, _Streamer, cut_at_stop

CONFIG = hj.ModelConfig(layers=("gdn", "attention"), d_model=32, num_heads=2, vocab_size=257,
                        init_std=0.3)


@pytest.fixture(scope="module")
def model():
    """Attention only: cheap to compile. The ragged-batch test adds a recurrent layer."""
    return hj.create_model(CONFIG.replace(layers=("attention",)), seed=1)


def argmax_continuation(model, prompt, steps):
    """Greedy by full forwards: one fixed-length (causal, so right padding is inert) compile."""
    forward = nnx.jit(lambda m, t: m(t))
    tokens = list(prompt)
    for _ in range(steps):
        padded = jnp.asarray([tokens + [0] * (len(prompt) + steps - len(tokens))])
        tokens.append(int(jnp.argmax(forward(model, padded)[0, len(tokens) - 1])))
    return tokens[len(prompt):]


def test_greedy_equals_argmax_of_full_forwards_ragged():
    model = hj.create_model(CONFIG, seed=1)  # a GDN layer: no padding may enter its state
    prompts = [[5, 9, 12, 40, 41], [7, 3]]
    batch = np.zeros((2, 5), np.int32)
    batch[1, :2] = prompts[1]
    batch[0] = prompts[0]
    out = np.asarray(generate(model, batch, 6, lengths=[5, 2]))
    for row, prompt in enumerate(prompts):
        assert out[row].tolist() == argmax_continuation(model, prompt, 6)


def test_a_one_token_prompt_continues(model):
    out = np.asarray(generate(model, jnp.asarray([[7]]), 4))
    assert out[0].tolist() == argmax_continuation(model, [7], 4)


def test_one_new_token_is_the_first_of_more(model):
    """The smallest request (max_new_tokens=1) gives a [B, 1] array: the greedy next token."""
    prompt = jnp.asarray([[5, 9, 12], [7, 3, 1]])
    one, four = (np.asarray(generate(model, prompt, n)) for n in (1, 4))
    assert one.shape == (2, 1)
    np.testing.assert_array_equal(one[:, 0], four[:, 0])
    assert one[1].tolist() == argmax_continuation(model, [7, 3, 1], 1)


def test_top_k_and_top_p_at_their_bounds(model):
    """top_k = 1 samples the greedy tokens at any temperature; top_k = the vocabulary size and
    top_p = 1 restrict nothing: the same draws as without them."""
    prompt = jnp.asarray([[5, 9, 12], [1, 2, 3]])
    sampled = lambda **kw: np.asarray(generate(model, prompt, 6, temperature=2.0, seed=3, **kw))
    np.testing.assert_array_equal(sampled(top_k=1), np.asarray(generate(model, prompt, 6)))
    unrestricted = sampled()
    np.testing.assert_array_equal(sampled(top_k=CONFIG.vocab_size), unrestricted)
    np.testing.assert_array_equal(sampled(top_p=1.0), unrestricted)
    # top_p reaches the sampler: a tiny one keeps only the most likely token.
    np.testing.assert_array_equal(sampled(top_p=1e-6), sampled(top_k=1))
    assert (unrestricted != sampled(top_k=1)).any()  # (temperature 2 leaves the greedy path)


def test_sampling_is_reproducible_from_the_seed(model):
    prompt = jnp.asarray([[5, 9, 12], [1, 2, 3]])
    kw = dict(temperature=1.0, top_k=50, top_p=0.9)
    a, b = (np.asarray(generate(model, prompt, 8, seed=3, **kw)) for _ in range(2))
    compiled = _generate._cache_size()
    c = np.asarray(generate(model, prompt, 8, seed=4, **kw))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    # Another temperature and top-p reuse the compiled loop.
    generate(model, prompt, 8, seed=3, temperature=0.5, top_k=50, top_p=0.7)
    assert _generate._cache_size() == compiled


def test_numpy_and_array_scalars_sample_as_python_numbers(model):
    """np.float32 (e.g. from a sweep over np.float32 values) and 0-d arrays are real numbers:
    they were refused as "temperature must be a finite number >= 0, got np.float32(0.7)"."""
    prompt = jnp.asarray([[5, 9, 12], [1, 2, 3]])
    want = np.asarray(generate(model, prompt, 4, temperature=0.7, top_p=0.9, seed=3))
    for convert in (np.float32, jnp.float32, np.asarray):
        got = generate(model, prompt, 4, temperature=convert(0.7), top_p=convert(0.9), seed=3)
        np.testing.assert_array_equal(np.asarray(got), want)
    for bad in (True, "0.7", np.ones(2)):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            generate(model, prompt, 4, temperature=bad)


def test_each_position_draws_with_its_own_key(model):
    """Sampling folds the position into the key: with every logit equal (the final norm's
    scale zeroed), 16 draws are not one token repeated, as one key for every step gives."""
    flat = nnx.clone(model)
    nnx.update(flat.final_norm, jax.tree.map(jnp.zeros_like, nnx.state(flat.final_norm)))
    prompt = jnp.asarray([[5, 9, 12]])
    assert float(jnp.abs(flat(prompt)).max()) == 0.0
    out = np.asarray(generate(flat, prompt, 16, temperature=1.0, seed=0))
    assert len(set(out[0].tolist())) > 8, out


def test_a_tiny_temperature_samples_the_greedy_tokens(model):
    """The temperature reaches the sampler: at 1e-4 every draw is the argmax."""
    prompt = jnp.asarray([[5, 9, 12], [1, 2, 3]])
    greedy = np.asarray(generate(model, prompt, 6))
    cold = np.asarray(generate(model, prompt, 6, temperature=1e-4, top_k=None, seed=5))
    np.testing.assert_array_equal(cold, greedy)


def test_a_temperature_below_float32s_range_samples_the_greedy_tokens(model):
    """1e-39 (a float32 subnormal) sent every positive logit to +inf, 1e-50 (0 in float32)
    made them NaN: both sampled other tokens than the argmax."""
    prompt = jnp.asarray([[5, 9, 12], [1, 2, 3]])
    greedy = np.asarray(generate(model, prompt, 6))
    for temperature in (1e-39, 1e-50):
        for top_p in (None, 0.9):
            cold = generate(model, prompt, 6, temperature=temperature, top_p=top_p, seed=5)
            np.testing.assert_array_equal(np.asarray(cold), greedy)


def test_the_position_limit_counts_the_longest_prompt(model):
    """prompt + new tokens may fill the positions exactly; the longest ragged row counts."""
    batch = jnp.asarray([[5, 9, 12, 40], [7, 3, 0, 0]])
    out = generate(model, batch, 6, lengths=[4, 2], max_positions=10)
    assert out.shape == (2, 6)
    with pytest.raises(ValueError, match="prompt of 4 tokens \\+ 7 new tokens is longer than "
                                         "the model's 10 positions"):
        generate(model, batch, 7, lengths=[4, 2], max_positions=10)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    draws = {int(sample_token(logits, jax.random.key(k), temperature=1.0, top_k=None,
                              top_p=0.7)[0]) for k in range(64)}
    assert draws == {0, 1}


def test_top_p_equal_to_the_top_probability_keeps_only_the_top_token():
    """The top token alone reaches p = its probability: the next one (whose preceding mass is
    exactly p) is left out."""
    logits = jnp.log(jnp.asarray([[0.25, 0.5, 0.25]]))
    top = float(jax.nn.softmax(logits)[0, 1])
    keys = jax.random.split(jax.random.key(0), 64)
    draws = jax.vmap(lambda k: sample_token(logits, k, temperature=1.0, top_k=None,
                                            top_p=top))(keys)
    assert set(np.asarray(draws).ravel().tolist()) == {1}


@pytest.mark.parametrize("options, expected", [
    (dict(temperature=1.0, top_k=2), [[0, 4, 0, 3], [0, 0, 5, 3]]),  # the k-th kept
    (dict(temperature=1.0, top_k=None, top_p=0.45), [[0, 4, 0, 3], [0, 0, 1, 0]]),
    (dict(temperature=0.5, top_k=None), [[1, 16, 4, 9], [0.25, 2.25, 25, 9]]),  # p²
])
def test_sample_token_draws_from_the_restricted_tempered_softmax(options, expected):
    """Frequencies of 4,000 draws against the distribution by hand (unnormalised rows of
    `expected`), for two rows in different orders (top-p sorts each row on its own)."""
    p = np.array([[0.1, 0.4, 0.2, 0.3], [0.05, 0.15, 0.5, 0.3]])
    logits = jnp.log(jnp.asarray(p, jnp.float32))
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = np.asarray(jax.vmap(lambda k: sample_token(logits, k, **options))(keys))
    freqs = np.stack([np.bincount(draws[:, r], minlength=4) for r in range(2)]) / len(keys)
    expected = np.asarray(expected, float)
    expected /= expected.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(freqs == 0, expected == 0)
    np.testing.assert_allclose(freqs, expected, atol=0.04)  # ≈ 5 standard deviations


def test_eos_ends_a_row(model):
    prompt = jnp.asarray([[5, 9, 12]])
    free = np.asarray(generate(model, prompt, 6))[0]
    stopped = np.asarray(generate(model, prompt, 6, eos_id=int(free[2])))[0]
    first = free.tolist().index(free[2])
    assert stopped[:first + 1].tolist() == free[:first + 1].tolist()
    assert (stopped[first:] == free[2]).all()


def test_streaming_marks_each_rows_own_new_tokens_and_prompts_never_stop(model):
    """Ragged prompts, the EOS id inside the longer prompt past the shorter one: `on_tokens`
    sees every position from the shorter prompt's end, `new` only on generated tokens (each
    row exactly `max_new_tokens` of them, the returned ones in order), and the prompt's EOS
    ends nothing."""
    eos = 200
    batch = np.asarray([[5, 9, 12, eos, 41], [7, 3, 0, 0, 0]], np.int32)
    free = np.asarray(generate(model, batch, 4, lengths=[5, 2]))
    assert eos not in free  # so only the prompt holds it
    seen = []

    def record(position, tokens, new):
        seen.append((int(position), tokens.copy(), new.copy()))
        return np.zeros(2, bool)  # stop no row

    out = np.asarray(generate(model, batch, 4, lengths=[5, 2], eos_id=eos, on_tokens=record))
    np.testing.assert_array_equal(out, free)
    assert [p for p, _, _ in seen] == list(range(2, 9))
    for row, length in enumerate((5, 2)):
        new = [p for p, _, n in seen if n[row]]
        assert new == list(range(length, length + 4)), row
        assert [int(t[row]) for p, t, n in seen if n[row]] == free[row].tolist()
    # A callback that stops row 1 at its first token: the rest of it reads as stopped (-1
    # without an EOS id); row 0 goes on.
    stop_row_1 = lambda p, t, n: np.asarray([False, p == 2])
    out = np.asarray(generate(model, batch, 4, lengths=[5, 2], on_tokens=stop_row_1))
    assert out[0].tolist() == free[0].tolist() and out[1].tolist() == [free[1, 0], -1, -1, -1]
    # A callback that stops every row at every position: a row in its prompt goes on, so each
    # row keeps its first generated token.
    out = np.asarray(generate(model, batch, 4, lengths=[5, 2],
                              on_tokens=lambda p, t, n: np.ones(2, bool)))
    assert out.tolist() == [[free[0, 0], -1, -1, -1], [free[1, 0], -1, -1, -1]]


def test_generate_text_stop_strings_and_streaming(model):
    tokenizer = ByteTokenizer()
    full = hj.generate_text(model, tokenizer, ["ab", "hello"], max_new_tokens=8)
    assert len(full.texts) == 2 and all(len(t) == 8 for t in full.tokens)
    stop = full.texts[1][3:5]
    pieces = []
    cut = hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8, stop=[stop],
                           on_text=lambda row, text: pieces.append(text))
    assert cut.texts[0] == full.texts[1][:full.texts[1].find(stop)]
    assert "".join(pieces) == cut.texts[0]
    assert tokenizer.decode(cut.tokens[0]) == cut.texts[0]  # the ids up to the stop string's
    # One string is one stop string, not one per character (a two-character stop given as a
    # string stopped at either character).
    two = full.texts[1][0] + "\x07"
    assert two not in full.texts[1]
    pieces = []
    assert hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8, stop=two,
                            on_text=lambda row, text: pieces.append(text)).texts == full.texts[1:]
    assert "".join(pieces) == full.texts[1]  # what a possible stop held back shows at the end


def test_generate_text_passes_sampling_and_ragged_prompts_to_generate(model):
    """The tokens are `generate`'s for the same sampling options and seed, each prompt at its
    own length (the shorter one is not padded to the longer)."""
    tokenizer = ByteTokenizer()
    options = dict(temperature=1.5, top_k=100, top_p=0.5, seed=3)
    result = hj.generate_text(model, tokenizer, ["ab", "hello"], max_new_tokens=6, **options)
    batch = np.zeros((2, 5), np.int32)
    batch[0, :2], batch[1] = tokenizer.encode("ab"), tokenizer.encode("hello")
    want = np.asarray(generate(model, batch, 6, lengths=[2, 5], **options))
    assert tokenizer.eos_id not in want
    for row in range(2):
        np.testing.assert_array_equal(result.tokens[row], want[row])


def test_generate_text_ends_rows_at_the_first_eos(model):
    """A row ends at the first of its EOS ids (by default the tokenizer's): its tokens and text
    stop before it, with the EOS id in the compiled loop or only in the streamer (several)."""
    tokenizer = ByteTokenizer()
    free = hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8).tokens[0]
    eos = int(free[2])
    first = free.tolist().index(eos)

    class EosTokenizer(ByteTokenizer):
        eos_id = eos

    for result in (hj.generate_text(model, EosTokenizer(), ["hello"], max_new_tokens=8),
                   hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8,
                                    eos_ids=[256, eos])):
        assert result.tokens[0].tolist() == free[:first].tolist()
        assert result.texts[0] == tokenizer.decode(free[:first])


def test_a_stop_string_ends_a_row_with_several_eos_ids_or_none(model):
    """Without one EOS id for the compiled loop, a row that a stop string ends is filled with
    -1 after it: the row ends there as with one EOS id (-1 is not decoded)."""
    tokenizer = ByteTokenizer()
    free = hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8)
    stop = free.texts[0][2:4]
    cut = lambda eos_ids: hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8,
                                           stop=stop, eos_ids=eos_ids)
    want = cut(None)
    assert want.texts == [free.texts[0][:free.texts[0].find(stop)]]
    for eos_ids in ([256, 255], []):
        result = cut(eos_ids)
        assert result.texts == want.texts, eos_ids
        assert result.tokens[0].tolist() == want.tokens[0].tolist(), eos_ids


def test_callbacks_and_eos_compile_once(model):
    """Stop strings, streaming callbacks and EOS ids are arguments of the compiled loop."""
    tokenizer = ByteTokenizer()
    hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8, stop=["x"])
    compiled = _generate._cache_size()
    for stop, eos in ((["y", "zz"], None), ([], [104, 105])):
        hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=8, stop=stop,
                         eos_ids=eos, on_text=lambda row, text: None)
    assert _generate._cache_size() == compiled


def test_generate_text_errors(model):
    tokenizer = ByteTokenizer()
    with pytest.raises(ValueError, match="prompt 0 encodes to no tokens"):
        hj.generate_text(model, tokenizer, [""])
    with pytest.raises(ValueError, match="longer than the model's 10 positions"):
        hj.generate_text(model, tokenizer, ["hello"], max_new_tokens=6, max_positions=10)
    with pytest.raises(ValueError, match="non-empty list"):
        hj.generate_text(model, tokenizer, "hello")
    with pytest.raises(ValueError, match="non-empty list"):
        hj.generate_text(model, tokenizer, [])
    for stop in ([""], ["a", 5]):  # an empty stop string matched nothing, silently
        with pytest.raises(ValueError, match=r"stop strings must be non-empty strings, got "):
            hj.generate_text(model, tokenizer, ["hello"], stop=stop)
    small = hj.create_model(CONFIG.replace(layers=("attention",), vocab_size=105))
    with pytest.raises(ValueError, match=r"tokenizer id 105 is outside the model's "
                                         r"vocab_size=105: is it the run's tokenizer\?"):
        hj.generate_text(small, tokenizer, ["ab", "hi"])  # the largest id of "hi" ("i")



def test_tokens_per_second_counts_the_tokens_of_every_row():
    result = TextGeneration(["abc", "hello"], [np.arange(3), np.arange(5)], seconds=2.0)
    assert result.tokens_per_second == 4.0

@pytest.mark.parametrize("text, stop, expected", [
    ("a\n\nb\n\nc", ["\n\n"], "a"),  # the first occurrence, not the last
    ("xAyBz", ["B", "A"], "x"),  # the earliest of several stop strings
    ("xAyBz", ["", "C"], "xAyBz"),  # empty and absent stop strings cut nothing
])
def test_text_is_cut_at_the_earliest_stop_string(text, stop, expected):
    assert cut_at_stop(text, stop) == expected


def test_streamer_shows_whole_characters_and_stops_rows_at_any_eos():
    """Host side of streaming, token by token: a UTF-8 character split over two byte tokens
    is shown once whole (never U+FFFD), and any of the EOS ids stops its row without being
    shown (the compiled loop knows one EOS id; the others are the streamer's)."""
    shown = []
    streamer = _Streamer(ByteTokenizer(), 2, stop=(), eos=(256, 7),
                         on_text=lambda row, text: shown.append((row, text)))
    both = np.ones(2, bool)
    for first, second in ((ord("a"), ord("b")), (0xC3, 7), (0xA9, ord("c"))):
        stopped = streamer(0, np.array([first, second]), both & ~streamer.stopped)
    assert shown == [(0, "a"), (1, "b"), (0, "é")]
    assert stopped.tolist() == [False, True]


class ByteFallbackTokenizer(ByteTokenizer):
    """Decodes an unfinished UTF-8 character to one U+FFFD a byte, as the byte-fallback decoder
    of SentencePiece-style tokenizers (Llama's `<0xNN>` tokens) does."""

    def decode(self, ids):
        data = bytes(ids)
        whole = next(n for n in range(len(data), -1, -1)
                     if data[:n].decode(errors="ignore").encode() == data[:n])
        return data[:whole].decode() + "\ufffd" * (len(data) - whole)


def test_streamer_waits_for_a_character_that_decodes_to_several_replacements():
    """A 3-byte character two bytes in decodes as two U+FFFD: one was shown (and stayed, as the
    character later took its place in a text of the same length)."""
    shown = []
    streamer = _Streamer(ByteFallbackTokenizer(), 1, stop=(), eos=(256,),
                         on_text=lambda row, text: shown.append(text))
    assert ByteFallbackTokenizer().decode("a中".encode()[:3]) == "a\ufffd\ufffd"
    for byte in "a中b".encode():
        streamer(0, np.array([byte]), np.ones(1, bool))
    assert shown == ["a", "中", "b"]


class LeadingCharDroppingTokenizer(ByteTokenizer):
    """Drops a text's leading `char` when decoding, as SentencePiece-style decoders drop the
    space before a text's first word."""

    def __init__(self, char: str):
        self.char = char

    def decode(self, ids):
        return super().decode(ids).removeprefix(self.char)


def test_a_continuation_is_decoded_behind_its_prompt(model):
    """Decoded alone, a continuation lost its leading space with such tokenizers ("Hello" +
    "world"): in the texts and in the stream, it is decoded behind its prompt."""
    prompts = ["ab", "hello"]
    full = hj.generate_text(model, ByteTokenizer(), prompts, max_new_tokens=8)
    tokenizer = LeadingCharDroppingTokenizer(full.texts[0][0])  # as if it were the space
    shown = ["", ""]

    def on_text(row, text):
        shown[row] += text

    result = hj.generate_text(model, tokenizer, prompts, max_new_tokens=8, on_text=on_text)
    assert result.texts == full.texts == shown
    assert [t.tolist() for t in result.tokens] == [t.tolist() for t in full.tokens]


def test_streamer_holds_back_a_possible_stop_string_and_stops_at_it():
    """Stop strings "cd" and "xyz": the last two characters wait (they may begin "xyz"); the
    token completing "cd" stops its row and shows all the text before it; `flush` shows the
    text held back in a row that did not stop."""
    shown = ["", ""]

    def on_text(row, text):
        shown[row] += text

    streamer = _Streamer(ByteTokenizer(), 2, stop=("cd", "xyz"), eos=(256,), on_text=on_text)
    seen = []
    for pair in ("aa", "bb", "cc", "de"):
        stopped = streamer(0, np.array([ord(c) for c in pair]), ~streamer.stopped)
        seen.append((*shown, *stopped.tolist()))
    assert seen == [("", "", False, False), ("", "", False, False), ("a", "a", False, False),
                    ("ab", "ab", True, False)]
    streamer.flush(["ab", "abce"])
    assert shown == ["ab", "abce"]


def test_padding_after_a_prompt_may_hold_any_value(model):
    """The padding after `lengths` is never read, so it is not checked against the vocabulary
    (-1 or an id past it was refused); an id inside a prompt still is."""
    batch = np.asarray([[5, 9, 12, 40, 41], [7, 3, 0, 0, 0]], np.int32)
    expected = np.asarray(generate(model, batch, 3, lengths=[5, 2]))
    padded = batch.copy()
    padded[1, 2:] = [-1, 999, -1]
    np.testing.assert_array_equal(generate(model, padded, 3, lengths=[5, 2]), expected)
    with pytest.raises(ValueError,
                       match=r"prompt token id -1 at index \[1, 2\] .* \(2 ids in all\)"):
        generate(model, padded, 3, lengths=[5, 4])


def test_ctrl_c_ends_a_streaming_loop_at_its_next_step(model):
    """SIGINT (Ctrl-C) during the loop reaches its callback (a recording handler, a signal
    wakeup socket): no row gets another token or callback, and KeyboardInterrupt comes out.
    Python alone held the interrupt until the loop's last token (its handler runs in the main
    thread, which waits in XLA) or raised it inside a callback (an XLA callback error).

    The signal goes to the callback's own thread, which handles it before the callback returns:
    `os.kill` targets the main thread, which on a loaded machine woke to handle it only after
    the loop's last step (a flaky test, not a slower Ctrl-C: one step later in real use)."""
    batch = np.asarray([[5, 9, 12, 40, 41], [7, 3, 0, 0, 0]], np.int32)
    calls = []

    def ctrl_c_once(position, tokens, new):
        calls.append(int(position))
        if len(calls) == 1:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        return np.zeros(2, bool)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            generate(model, batch, 4, lengths=[5, 2], on_tokens=ctrl_c_once)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [2]
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup socket is gone


def test_an_error_in_the_callback_ends_the_loop_and_comes_out_as_itself(model):
    """A streaming print into a closed pipe (`generate | head -1`) raised BrokenPipeError in
    the callback, which came out as an XLA callback error: now the loop ends at its next step
    and `generate` raises the callback's own exception."""
    batch = np.asarray([[5, 9, 12, 40, 41], [7, 3, 0, 0, 0]], np.int32)
    calls = []

    def closed_pipe(position, tokens, new):
        calls.append(int(position))
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError, match="Broken pipe"):
        generate(model, batch, 4, lengths=[5, 2], on_tokens=closed_pipe)
    assert calls == [2]
