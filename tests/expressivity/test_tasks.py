"""Task generators: determinism, vocabulary layout, and every target checked by brute force."""

import dataclasses

import numpy as np
import pytest

from hybrid_jax.config import ExperimentConfig, data_config_class, from_dict, to_dict
from hybrid_jax.data.pipeline import eval_batches
from hybrid_jax.data.tasks import (
    ARDecodingConfig,
    MKARConfig,
    NeedleConfig,
    SelectiveCopyingConfig,
    split_config,
)

CONFIGS = [SelectiveCopyingConfig(), MKARConfig(), ARDecodingConfig(), NeedleConfig(),
           NeedleConfig(num_needles=6, num_keys=6, seq_len=24)]  # needles fill 18 of 22 places


def examples(config, split="eval", seed=0, count=200):
    source = config.source(split, seed)
    return [source[i] for i in range(count)]


def check_selective_copying(c, ex):
    """Walk back from each position to the most recent number token; copy from d back."""
    x = ex["inputs"]
    for t in range(len(x)):
        s = t - 1
        while s >= 0 and x[s] < c.num_tokens:
            s -= 1
        defined = s >= 0 and t - (x[s] - c.num_tokens + c.min_distance) >= 0
        assert ex["mask"][t] == defined, t
        if defined:
            d = x[s] - c.num_tokens + c.min_distance
            assert c.min_distance <= d <= c.max_distance
            assert ex["targets"][t] == x[t - d], t


def check_mkar(c, ex):
    """For each position, search all earlier key occurrences; the latest one's successor."""
    x, k = list(ex["inputs"]), c.key_len
    for t in range(len(x)):
        key = x[t - k + 1:t + 1] if t >= k - 1 else None
        ends = [j for j in range(k - 1, t) if key is not None and x[j - k + 1:j + 1] == key]
        assert ex["mask"][t] == bool(ends), t
        if ends:
            assert ex["targets"][t] == x[max(ends) + 1], t


def check_ar_decoding(c, ex):
    x = ex["inputs"]
    bits = x[-c.num_bits:] - c.bit_tokens[0]
    assert set(bits.tolist()) <= {0, 1} and x[-c.num_bits - 1] == c.query_token
    word = int("".join(map(str, bits)), 2)
    body = list(x[:-c.num_bits - 1])
    assert max(body) < c.num_words
    last = max(j for j in range(len(body) - 1) if body[j] == word)
    assert ex["mask"].tolist() == [False] * (c.seq_len - 1) + [True]
    assert ex["targets"][-1] == body[last + 1]


def check_needle(c, ex):
    x = list(ex["inputs"])
    starts = [i for i, t in enumerate(x) if t == c.needle_token]
    assert len(starts) == c.num_needles and x[-2] == c.query_token
    assert np.all(np.diff(starts) >= 3) and starts[-1] + 3 <= len(x) - 2
    pairs = {x[s + 1]: x[s + 2] for s in starts}
    assert len(pairs) == c.num_needles  # distinct keys
    assert all(c.num_filler <= k < c.num_filler + c.num_keys for k in pairs)
    assert all(c.num_filler + c.num_keys <= v < c.needle_token for v in pairs.values())
    assert x[-1] in pairs
    assert ex["mask"].tolist() == [False] * (c.seq_len - 1) + [True]
    assert ex["targets"][-1] == pairs[x[-1]]
    needles = {s + i for s in starts for i in range(3)}
    assert all(t < c.num_filler for i, t in enumerate(x[:-2]) if i not in needles)
    return starts[0] / (c.seq_len - 5)


CHECKS = {SelectiveCopyingConfig: check_selective_copying, MKARConfig: check_mkar,
          ARDecodingConfig: check_ar_decoding, NeedleConfig: check_needle}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).kind)
def test_every_target_is_brute_force_correct(config):
    for ex in examples(config):
        assert ex["inputs"].shape == ex["targets"].shape == ex["mask"].shape == (config.seq_len,)
        assert ex["inputs"].dtype == ex["targets"].dtype == np.int32
        assert ex["mask"].dtype == bool
        assert 0 <= ex["inputs"].min() and ex["inputs"].max() < config.vocab_size
        assert 0 <= ex["targets"].min() and ex["targets"].max() < config.vocab_size
        assert ex["mask"].any()
        CHECKS[type(config)](config, ex)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).kind)
def test_deterministic_per_seed_and_split(config):
    a, b = examples(config, count=5), examples(config, count=5)
    for x, y in zip(a, b, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    other_seed = examples(config, seed=1, count=5)
    train = examples(config, split="train", count=5)
    assert any((x["inputs"] != y["inputs"]).any() for x, y in zip(a, other_seed, strict=True))
    assert any((x["inputs"] != y["inputs"]).any() for x, y in zip(a, train, strict=True))


@pytest.mark.parametrize("config", [
    SelectiveCopyingConfig(eval_seq_len=400, eval_number_prob=0.4),
    MKARConfig(eval_seq_len=200, eval_token_skew=1.0),
    ARDecodingConfig(eval_seq_len=200, eval_ones_prob=0.9),
    NeedleConfig(eval_seq_len=300, eval_min_depth=0.8, eval_max_depth=0.9),
], ids=lambda c: type(c).kind)
def test_eval_split_uses_eval_fields(config):
    """Length generalisation and OOD knobs: the eval split follows the eval_* fields."""
    evaluated = split_config(config, "eval")
    assert evaluated.seq_len > config.seq_len
    assert split_config(config, "train") == dataclasses.replace(
        config, **{f.name: None for f in dataclasses.fields(config)
                   if f.name.startswith("eval_")})
    train_ex, eval_ex = examples(config, "train", count=50), examples(config, "eval", count=50)
    assert train_ex[0]["inputs"].shape == (config.seq_len,)
    assert eval_ex[0]["inputs"].shape == (evaluated.seq_len,)
    for ex in eval_ex:
        result = CHECKS[type(config)](evaluated, ex)
        if isinstance(config, NeedleConfig):
            assert 0.79 <= result <= 0.91


def test_ood_knobs_shift_the_distribution():
    ones = lambda c: np.mean([(ex["inputs"][-c.num_bits:] - c.bit_tokens[0]).mean()
                              for ex in examples(c, count=300)])
    assert ones(ARDecodingConfig(ones_prob=0.9)) > 0.8 > 0.2 > ones(ARDecodingConfig(ones_prob=0.1))
    numbers = lambda c: np.mean([(ex["inputs"] >= c.num_tokens).mean() for ex in examples(c)])
    assert abs(numbers(SelectiveCopyingConfig(number_prob=0.4)) - 0.4) < 0.02
    skewed = np.concatenate([ex["inputs"] for ex in examples(MKARConfig(token_skew=2.0))])
    assert np.mean(skewed == 0) > 0.5


def test_every_needle_is_queried_and_spread_over_the_depths():
    c = NeedleConfig(num_needles=4, seq_len=64)
    queried, first, last = np.zeros(4), [], []
    for ex in examples(c, count=400):
        starts = np.flatnonzero(ex["inputs"] == c.needle_token)
        queried[list(ex["inputs"][starts + 1]).index(ex["inputs"][-1])] += 1
        first.append(starts[0])
        last.append(starts[-1])
    assert queried.min() > 70  # uniform: 100 each
    assert min(first) <= 2 and max(last) >= 64 - 5 - 2  # needles reach both ends


@pytest.mark.parametrize("depth, first", [(0.0, 0), (1.0, 64 - 2 - 3 * 3)])
def test_needles_at_an_extreme_depth_touch_that_end(depth, first):
    """Depth 0: the needles are the first 9 tokens; depth 1: the last 9 before the query."""
    c = NeedleConfig(num_needles=3, seq_len=64, min_depth=depth, max_depth=depth)
    for ex in examples(c, count=5):
        assert np.flatnonzero(ex["inputs"] == c.needle_token).tolist() == [first, first + 3,
                                                                            first + 6]


def test_every_distance_is_drawn_and_the_shortest_body_has_its_word():
    """Selective copying draws distances min..max inclusive; AR decoding at its shortest
    length (a body of 2) plants the queried word where a token follows it, every time."""
    c = SelectiveCopyingConfig(min_distance=2, max_distance=4, number_prob=0.5, seq_len=40)
    seen = np.unique(np.concatenate([ex["inputs"] for ex in examples(c, count=50)]))
    assert {c.number_token(d) for d in (2, 3, 4)} <= set(seen.tolist())
    short = ARDecodingConfig(num_bits=5, seq_len=8)
    for ex in examples(short, count=40):
        check_ar_decoding(short, ex)


@pytest.mark.parametrize("config", [
    SelectiveCopyingConfig(num_tokens=4, min_distance=1, max_distance=3, seq_len=20),
    MKARConfig(vocab_size=5, seq_len=20),
    ARDecodingConfig(num_bits=2, seq_len=20),
    NeedleConfig(num_filler=3, num_keys=3, num_values=3, num_needles=2, seq_len=20),
], ids=lambda c: type(c).kind)
def test_the_whole_vocabulary_is_drawn(config):
    """Every id below vocab_size occurs (none left out of its range), and in AR decoding every
    word occurs in bodies whose query is another word, so not only where it is planted."""
    exs = examples(config, count=60)
    assert set(np.concatenate([ex["inputs"] for ex in exs]).tolist()) == set(
        range(config.vocab_size))
    if isinstance(config, ARDecodingConfig):
        for word in range(config.num_words):
            code = [config.bit_tokens[int(b)] for b in f"{word:0{config.num_bits}b}"]
            bodies = [ex["inputs"][:-config.num_bits - 1] for ex in exs
                      if ex["inputs"][-config.num_bits:].tolist() != code]
            assert any(word in body for body in bodies), word


def test_mkar_keys_over_a_large_vocabulary_stay_distinct():
    """vocab 2^16, keys of 5 tokens: 2^80 keys, more than an int64 holds. Skewed tokens make
    keys that differ only in their first token (3,0,0,0,0 and 0,0,0,0,0); they are different
    keys. (Keys once were numbers in base vocab_size: the first token overflowed away and such
    keys were recalled as one.)"""
    config = MKARConfig(vocab_size=2**16, key_len=5, seq_len=12, token_skew=4.0)
    for ex in examples(config, count=50):
        check_mkar(config, ex)


def test_mkar_at_its_shortest_and_smallest():
    """seq_len = key_len + 2 and a vocabulary of 2 are valid, with brute-force-correct targets."""
    for config in (MKARConfig(key_len=3, seq_len=5), MKARConfig(vocab_size=2, key_len=1,
                                                                seq_len=3)):
        for ex in examples(config, count=20):
            check_mkar(config, ex)


def test_vocabulary_layouts():
    sc = SelectiveCopyingConfig(num_tokens=10, min_distance=2, max_distance=4)
    assert sc.vocab_size == 13 and sc.number_token(2) == 10 and sc.number_token(4) == 12
    ar = ARDecodingConfig(num_bits=3)
    assert (ar.num_words, ar.bit_tokens, ar.query_token, ar.vocab_size) == (8, (8, 9), 10, 11)
    mkar = MKARConfig()  # 8 tokens, keys of 2: the 64 keys of the module docstring
    assert (mkar.vocab_size, mkar.key_len) == (8, 2)
    skewed = MKARConfig(vocab_size=3, token_skew=1.0).token_probs()  # ∝ 1, 1/2, 1/3
    np.testing.assert_allclose(skewed, np.array([6, 3, 2]) / 11, rtol=1e-12)
    nd = NeedleConfig(num_filler=4, num_keys=2, num_values=3)
    assert (nd.needle_token, nd.query_token, nd.vocab_size) == (9, 10, 11)


@pytest.mark.parametrize("config, message", [
    (dict(kind=SelectiveCopyingConfig, max_distance=3), "max_distance=3: expected a value >= 5"),
    (dict(kind=SelectiveCopyingConfig, number_prob=1.5), r"number_prob=1.5: .* <= 1.0"),
    # configs whose examples would never score a position
    (dict(kind=SelectiveCopyingConfig, number_prob=0.0), "number_prob=0: expected a value > 0"),
    (dict(kind=SelectiveCopyingConfig, eval_number_prob=0.0),
     r"eval split \(eval_\* fields\) is invalid: .*number_prob=0: expected a value > 0"),
    (dict(kind=SelectiveCopyingConfig, seq_len=5), "seq_len=5: expected a value >= 6"),
    (dict(kind=SelectiveCopyingConfig, eval_seq_len=1),
     r"eval split \(eval_\* fields\) is invalid: .*seq_len=1"),
    (dict(kind=MKARConfig, seq_len=3), "seq_len=3"),
    (dict(kind=MKARConfig, vocab_size=1), "MKARConfig.vocab_size=1: expected a value >= 2"),
    (dict(kind=MKARConfig, key_len=0), "MKARConfig.key_len=0: expected a value >= 1"),
    (dict(kind=MKARConfig, token_skew=-0.5), r"MKARConfig.token_skew=-0.5: expected a value >= 0"),
    (dict(kind=MKARConfig, eval_seq_len=3),
     r"eval split \(eval_\* fields\) is invalid: MKARConfig.seq_len=3"),
    (dict(kind=ARDecodingConfig, seq_len=7), "seq_len=7"),
    (dict(kind=ARDecodingConfig, num_bits=0),
     "ARDecodingConfig.num_bits=0: expected a value >= 1 and <= 16"),
    (dict(kind=ARDecodingConfig, num_bits=17, seq_len=30), "num_bits=17: .* <= 16"),
    (dict(kind=ARDecodingConfig, ones_prob=1.5),
     r"ARDecodingConfig.ones_prob=1.5: expected a value >= 0.0 and <= 1.0"),
    (dict(kind=ARDecodingConfig, eval_ones_prob=-0.1),
     r"eval split \(eval_\* fields\) is invalid: ARDecodingConfig.ones_prob=-0.1"),
    (dict(kind=NeedleConfig, min_depth=-0.1),
     "NeedleConfig.min_depth=-0.1: expected a value >= 0.0 and <= 1.0"),
    (dict(kind=SelectiveCopyingConfig, min_distance=0, max_distance=3),
     "SelectiveCopyingConfig.min_distance=0: expected a value >= 1"),  # d = 0 copies x_t itself
    (dict(kind=NeedleConfig, min_depth=0.9, max_depth=0.5), "max_depth=0.5"),
    (dict(kind=NeedleConfig, num_needles=9, num_keys=8), r"num_needles=9: .* <= 8"),
    (dict(kind=NeedleConfig, num_needles=4, seq_len=13), r"seq_len=13: expected a value >= 14"),
])
def test_bad_configs_are_named(config, message):
    kind = config.pop("kind")
    with pytest.raises(ValueError, match=message):
        kind(**config)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).kind)
def test_registered_and_round_trip(config):
    assert data_config_class(type(config).kind) is type(config)
    from hybrid_jax import presets

    experiment = ExperimentConfig(name="x", model=presets.get("transformer-tiny"), data=config)
    assert from_dict(ExperimentConfig, to_dict(experiment)).data == config
    batch = eval_batches(config, batch_size=4, num_batches=1, seed=0)[0]
    assert batch["inputs"].shape == (4, config.seq_len)
