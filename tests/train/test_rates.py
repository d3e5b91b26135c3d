"""The rates a text run logs: FLOPs per token of each packed batch as `hybrid_jax.flops`
counts them (attention within each document), per device of the mesh, MFU by 6N and by the
model count, and the step's learning rate."""

import logging

import pytest

from hybrid_jax import presets
from hybrid_jax.config import (
    ExperimentConfig,
    MeshConfig,
    ModelConfig,
    ModeSchedule,
    TrainConfig,
    layer,
)
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.pipeline import train_iterator
from hybrid_jax.flops import step_flops
from hybrid_jax.train.metrics import read_metrics
from hybrid_jax.train.optimizer import learning_rate_schedule
from hybrid_jax.train.trainer import _Run, bind_data, train
from tests.data.corpus_helpers import tiny_text_experiment, write_corpus

STEPS = 3


def test_logged_flops_count_attention_within_each_packed_document(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    experiment = tiny_text_experiment(corpus, steps=STEPS, peak_tflops=1.0)  # log_every 1
    train(experiment, tmp_path / "run", progress=False)
    logged = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    batches = train_iterator(bind_data(experiment.data, None),
                             batch_size=experiment.train.batch_size, seed=experiment.train.seed)
    flops = step_flops(experiment.model, experiment.data.seq_len)
    expected = [flops.training_per_token(next(batches)["segment_ids"]) for _ in range(STEPS)]
    assert min(expected) < flops.training_per_token()  # a batch of several documents a row
    assert [r["tflops_per_device"] * 1e12 / r["tokens_per_s_per_device"] for r in logged] == \
        pytest.approx(expected, rel=1e-6)
    for r in logged:  # mesh.data=1: one device of the host's eight
        assert r["tokens_per_s_per_device"] == r["tokens_per_s"]
        assert r["mfu"] * 1e12 == pytest.approx(flops.six_n * r["tokens_per_s"])
        assert r["mfu_model"] == pytest.approx(r["tflops_per_device"])  # peak 1 TFLOP/s
    schedule = learning_rate_schedule(experiment.train)
    # The rate each step applied: warmup from 0 at step 1 to the peak at step 3.
    assert [r["lr"] for r in logged] == pytest.approx([float(schedule(s)) for s in range(3)])
    assert [r["lr"] for r in logged] == pytest.approx([0.0, 0.005, 0.01])


def test_eval_checkpoint_and_compile_time_is_not_in_the_logged_rates(tmp_path, monkeypatch):
    """The checkpoint and the eval of step 4 (each made 0.4 s slower) fell in the log interval
    of steps 5–6, which read as a throughput dip, and the compile in the first: the logged
    tokens/s count the steps' time only."""
    import time

    import hybrid_jax.train.trainer as trainer
    from hybrid_jax.train.checkpoint import Checkpointer

    slow = 0.4

    def slowed(function):
        def run(*args, **kwargs):
            time.sleep(slow)
            return function(*args, **kwargs)
        return run

    monkeypatch.setattr(trainer, "evaluate", slowed(trainer.evaluate))
    monkeypatch.setattr(Checkpointer, "save", slowed(Checkpointer.save))
    corpus = write_corpus(tmp_path / "corpus")
    experiment = tiny_text_experiment(corpus, steps=6, log_every=2, eval_every=4)
    train(experiment, tmp_path / "run", progress=False)
    logged = {r["step"]: r for r in read_metrics(tmp_path / "run") if "loss" in r}
    tokens = 2 * experiment.train.batch_size * experiment.data.seq_len  # two steps a line
    assert tokens / logged[6]["tokens_per_s"] < slow / 4
    # Nor is the train step's compile in the first line's (0.8 s in, 0.1 s out, on a CPU).
    assert tokens / logged[2]["tokens_per_s"] < 0.4


def _started(model, caplog, **train):
    """A run of `model` on MQAR, started (no step) and closed; the warnings it logged."""
    experiment = ExperimentConfig(name="flops", model=model,
                                  data=MQARConfig(vocab_size=model.vocab_size, seq_len=16,
                                                  num_kv_pairs=2),
                                  train=TrainConfig(steps=1, warmup_steps=1, batch_size=2,
                                                    mesh=MeshConfig(data=1), **train))
    with caplog.at_level(logging.WARNING, logger="hybrid_jax"):
        run = _Run(experiment, None, progress=False, resume=False)
        run.close()
    return run, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_run_warns_once_of_block_types_its_model_count_leaves_out(caplog):
    model = ModelConfig(layers=(layer("mamba1"), "attention", layer("mamba1")), vocab_size=32,
                        d_model=32, num_heads=2)
    _, warnings = _started(model, caplog)
    assert len(warnings) == 1
    assert "['mamba1']" in warnings[0] and "mfu_model" in warnings[0]


def test_a_run_counts_oryx_attention_under_its_mode_schedule(caplog):
    """random_chunks at attention_prob 0.25: a quarter of the rows attend; no warning."""
    model = presets.get("oryx-gdn-tiny")
    run, warnings = _started(model, caplog, mode_schedule=ModeSchedule(
        pattern="random_chunks", attention_prob=0.25))
    assert run.flops == step_flops(model, 16, attention_fraction=0.25) != step_flops(model, 16)
    assert warnings == []
