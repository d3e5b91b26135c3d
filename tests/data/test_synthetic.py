"""The base of the synthetic sources: split and index checks, one random stream per example."""

import pytest

from hybrid_jax.data import MQARConfig
from hybrid_jax.data.synthetic import example_rng


def test_unknown_splits_and_out_of_range_indices_are_refused():
    config = MQARConfig(seq_len=8, num_kv_pairs=1, num_eval_examples=3)
    source = config.source("eval", 0)
    assert len(source) == 3 and source[2]["inputs"].shape == (8,)
    for index in (3, -1):
        with pytest.raises(IndexError, match=f"example {index} out of range for a eval split "
                                             "of 3"):
            source[index]
    with pytest.raises(ValueError, match=r"unknown split 'test'; expected one of "
                                         r"\('train', 'eval'\)"):
        config.source("test", 0)


def test_every_seed_split_and_index_has_its_own_stream():
    """No two of (seed, split, index) share draws, neighbours included: (seed 0, example 1) is
    not (seed 1, example 0), as it would be if seed and index were added."""
    draws = {example_rng(seed, split, index).integers(2**62, size=2).tobytes()
             for seed in range(4) for split in ("train", "eval") for index in range(4)}
    assert len(draws) == 32
