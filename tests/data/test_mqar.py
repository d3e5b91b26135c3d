"""MQAR examples: every target verified by brute force; determinism; grain iterator state."""

import numpy as np
import pytest

from hybrid_jax.data import MQARConfig, eval_batches, train_iterator


@pytest.mark.parametrize("config", [MQARConfig(), MQARConfig(vocab_size=64, seq_len=32,
                                                             num_kv_pairs=4,
                                                             random_non_queries=False)])
def test_every_target_is_the_value_of_its_key(config):
    source = config.source("train", seed=3)
    half = config.vocab_size // 2
    for i in range(50):
        ex = source[i]
        inputs, targets, mask = ex["inputs"], ex["targets"], ex["mask"]
        assert inputs.shape == targets.shape == mask.shape == (config.seq_len,)
        assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == bool
        context = 2 * config.num_kv_pairs
        keys, values = inputs[0:context:2], inputs[1:context:2]
        assert len(set(keys)) == len(keys) and len(set(values)) == len(values)
        assert np.all((1 <= keys) & (keys < half)) and np.all(values >= half)
        assert mask.sum() == config.num_kv_pairs and not mask[:context].any()
        pair = dict(zip(keys.tolist(), values.tolist(), strict=True))
        for t in np.flatnonzero(mask):
            assert (t - context) % 2 == 0  # queries sit on even offsets after the context
            assert targets[t] == pair[int(inputs[t])]
        assert sorted(inputs[mask].tolist()) == sorted(keys.tolist())  # each key queried once
        if not config.random_non_queries:
            assert np.all(inputs[context:][~mask[context:]] == 0)


def test_every_key_value_offset_and_filler_token_is_drawn():
    """vocab 8, one pair, 8 tokens, uniform gaps (power_a 1): keys 1..3, values 4..7, the query
    at each of 2, 4, 6 (up to the last even place), filler over the whole vocabulary; every
    example its own."""
    config = MQARConfig(vocab_size=8, seq_len=8, num_kv_pairs=1, power_a=1.0)
    source = config.source("train", 0)
    exs = [source[i] for i in range(100)]
    assert {int(ex["inputs"][0]) for ex in exs} == {1, 2, 3}
    assert {int(ex["inputs"][1]) for ex in exs} == {4, 5, 6, 7}
    assert {int(np.flatnonzero(ex["mask"])[0]) for ex in exs} == {2, 4, 6}
    filler = np.concatenate([ex["inputs"][2:][~ex["mask"][2:]] for ex in exs])
    assert set(filler.tolist()) == set(range(8))
    assert len({ex["inputs"].tobytes() for ex in exs}) > 50


def test_the_tightest_configs_are_valid():
    """4·num_kv_pairs == seq_len and keys exactly filling 1..vocab/2−1 are allowed."""
    for config in (MQARConfig(seq_len=16, num_kv_pairs=4),
                   MQARConfig(vocab_size=18, seq_len=32, num_kv_pairs=8)):
        ex = config.source("train", 0)[0]
        assert ex["mask"].sum() == config.num_kv_pairs


def test_examples_are_deterministic_and_splits_differ():
    config = MQARConfig()
    a, b = config.source("train", 0), config.source("train", 0)
    assert all(np.array_equal(a[i]["inputs"], b[i]["inputs"]) for i in range(5))
    evals = config.source("eval", 0)
    assert not np.array_equal(a[0]["inputs"], evals[0]["inputs"])
    assert not np.array_equal(a[0]["inputs"], config.source("train", 1)[0]["inputs"])


def test_short_gaps_are_likelier():
    config = MQARConfig(seq_len=256, num_kv_pairs=4, random_non_queries=False)
    source = config.source("train", 0)
    gaps = np.concatenate([np.flatnonzero(source[i]["mask"]) for i in range(300)])
    assert np.mean(gaps < 8 + 64) > 0.4  # ∝ g^(a−1): mass piles up at the start


@pytest.mark.parametrize("power_a", [0.01, 0.5])
def test_gaps_follow_the_power_law(power_a):
    """One pair in 64 tokens: the query is at 2·g for gap g in 1..31 with p(g) ∝ a·g^(a−1);
    the first gaps' frequencies over 2000 examples match it."""
    config = MQARConfig(seq_len=64, num_kv_pairs=1, power_a=power_a)
    source = config.source("train", 0)
    gap = np.array([np.flatnonzero(source[i]["mask"])[0] for i in range(2000)]) // 2
    p = power_a * np.arange(1, 32) ** (power_a - 1.0)
    expected = (p / p.sum())[:3]
    observed = np.bincount(gap, minlength=32)[1:4] / len(gap)
    assert np.allclose(observed, expected, atol=0.03), (observed, expected)


def test_iterator_state_resumes_exactly():
    config = MQARConfig(seq_len=16, num_kv_pairs=2)
    it = train_iterator(config, batch_size=4, seed=0)
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it)["inputs"] for _ in range(2)]
    it2 = train_iterator(config, batch_size=4, seed=0)
    it2.set_state(state)
    assert all(np.array_equal(next(it2)["inputs"], e) for e in expected)


def test_sharded_iterators_split_each_batch():
    config = MQARConfig(seq_len=16, num_kv_pairs=2)
    full = next(train_iterator(config, batch_size=4, seed=0))["inputs"]
    parts = [next(train_iterator(config, batch_size=4, seed=0, shard_index=i,
                                 shard_count=2))["inputs"] for i in range(2)]
    assert np.array_equal(np.concatenate(parts), full)
    with pytest.raises(ValueError, match="batch_size=4 is not divisible by the 3"):
        train_iterator(config, batch_size=4, seed=0, shard_index=0, shard_count=3)


def test_eval_batches_and_bad_configs():
    batches = eval_batches(MQARConfig(num_eval_examples=10), batch_size=4, num_batches=5, seed=0)
    assert len(batches) == 2
    with pytest.raises(ValueError, match="num_kv_pairs=20"):
        MQARConfig(seq_len=64, num_kv_pairs=20)
    with pytest.raises(ValueError, match="seq_len=63"):
        MQARConfig(seq_len=63)
    with pytest.raises(ValueError, match="vocab_size=16 is too small"):
        MQARConfig(vocab_size=16, num_kv_pairs=8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(seq_len=2), r"MQARConfig.seq_len=2: expected an even length >= 4"),
    (dict(num_kv_pairs=0), r"MQARConfig.num_kv_pairs=0: expected 1 <= 4·num_kv_pairs <= "
                           r"seq_len=64"),
    (dict(seq_len=16, num_kv_pairs=5), r"num_kv_pairs=5: .* <= seq_len=16"),
    (dict(power_a=0.0), r"MQARConfig.power_a=0.0: expected a value in \(0, 1\]"),
    (dict(power_a=1.5), r"MQARConfig.power_a=1.5: expected a value in \(0, 1\]"),
])
def test_bad_configs_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MQARConfig(**kwargs)
