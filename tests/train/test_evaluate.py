"""The trainer's held-out evaluation and its checks, without a model: `evaluate` sums the eval
step's statistics over every batch (a stand-in step here, its values chosen by hand),
`held_out_set` draws the run's seed, `_check_vocab` takes a vocabulary that fits exactly,
`check_process_rows` refuses any process whose devices hold other rows."""

import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import _check_vocab, check_process_rows, evaluate, held_out_set

# Each batch's stats by its first input id: loss_sum, correct (count is its mask's sum).
STATS = {1: (12.0, 3.0), 2: (2.0, 2.0)}


def fake_batch(batch_id: int, mask: list[list[int]], target_bytes: list[list[int]]) -> dict:
    inputs = np.full((2, 4), batch_id, np.int32)
    return {"inputs": inputs, "targets": inputs, "mask": np.asarray(mask, bool),
            "target_bytes": np.asarray(target_bytes, np.int32)}


def fake_eval_step(state, batch):
    loss_sum, correct = STATS[int(batch["inputs"][0, 0])]
    return {"loss_sum": loss_sum, "correct": correct, "count": float(batch["mask"].sum())}


@pytest.fixture(scope="module")
def batches():
    # 6 + 2 scored positions (9 + 4 bytes); the 3 + 6 bytes under the others are not counted.
    return [fake_batch(1, [[1, 1, 1, 1], [1, 1, 0, 0]], [[1, 2, 1, 1], [3, 1, 1, 2]]),
            fake_batch(2, [[1, 0, 0, 0], [0, 0, 0, 1]], [[2, 1, 1, 1], [1, 1, 1, 2]])]


@pytest.fixture(scope="module")
def ts():
    return SimpleNamespace(state=None, mesh=make_mesh(MeshConfig(data=1), jax.devices()[:1]))


def test_evaluate_pools_every_batch(ts, batches):
    """Loss and accuracy over all 8 scored positions of both batches (not a mean of batch
    means, nor divided by the batch count); bytes of the scored targets only; words of the
    whole text. The batches are left as they were."""
    metrics = evaluate(ts, batches, fake_eval_step, num_words=5)
    assert metrics == pytest.approx({
        "loss": 14 / 8, "perplexity": math.exp(14 / 8), "accuracy": 5 / 8, "tokens": 8,
        "bits_per_byte": 14 / (math.log(2) * 13), "bytes": 13,
        "word_perplexity": math.exp(14 / 5)}, rel=1e-12)
    assert all("target_bytes" in batch for batch in batches)
    assert evaluate(ts, batches, fake_eval_step) == pytest.approx(
        {k: metrics[k] for k in ("loss", "perplexity", "accuracy", "tokens", "bits_per_byte",
                                 "bytes")}, rel=1e-12)


def test_evaluate_caps_the_perplexities_of_a_diverged_model(ts, batches):
    """A loss past ln(float max) reports e^700, not an OverflowError."""
    huge = {1: (8000.0, 0.0), 2: (0.0, 0.0)}

    def diverged(state, batch):
        loss_sum, correct = huge[int(batch["inputs"][0, 0])]
        return {"loss_sum": loss_sum, "correct": correct, "count": float(batch["mask"].sum())}

    metrics = evaluate(ts, batches, diverged, num_words=5)
    assert metrics["loss"] == 1000.0
    assert metrics["perplexity"] == metrics["word_perplexity"] == math.exp(700.0)


def test_held_out_set_of_synthetic_data_is_drawn_from_the_runs_seed():
    data = MQARConfig(vocab_size=32, seq_len=12, num_kv_pairs=2)
    held_out, words = held_out_set(data, 2, 2, seed=7)
    source = data.source("eval", 7)
    assert words is None and len(held_out) == 2
    for i, batch in enumerate(held_out):
        for key in ("inputs", "targets", "mask"):
            np.testing.assert_array_equal(batch[key], np.stack([source[2 * i][key],
                                                                source[2 * i + 1][key]]))
    other = held_out_set(data, 2, 2, seed=0)[0]
    assert not np.array_equal(other[0]["inputs"], held_out[0]["inputs"])


def test_a_data_vocabulary_of_the_models_size_fits():
    experiment = ExperimentConfig(name="vocab", model=ModelConfig(vocab_size=64),
                                  data=MQARConfig(vocab_size=64))
    _check_vocab(experiment, experiment.data)  # ids 0..63: every one has an embedding row
    bigger = ExperimentConfig(name="vocab", model=ModelConfig(vocab_size=64),
                              data=MQARConfig(vocab_size=65))
    with pytest.raises(ValueError, match="data.vocab_size=65 exceeds model.vocab_size=64"):
        _check_vocab(bigger, bigger.data)


@pytest.mark.parametrize("index", [0, 1])
def test_each_process_of_a_replicated_batch_is_refused(monkeypatch, index):
    """Process 0's devices holding all 8 rows is refused too, not only process 1's: each
    process must hold exactly its own half."""
    mesh = make_mesh(MeshConfig(data=1, tensor=4), jax.devices()[:4])
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: index)
    own = f"{4 * index}\\.\\.{4 * index + 3}"
    with pytest.raises(ValueError, match=rf"process {index} of 2: its devices hold batch rows "
                                         rf"\[0, 1, 2, 3, 4, 5, 6, 7\]\.\.\., not its own {own}"):
        check_process_rows(mesh, 8)
