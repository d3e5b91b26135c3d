"""A run traces its model's initialisation once before the first step: the FLOP count, the
shardings, the checkpoint restore and the initial values all start from one abstract state."""

import dataclasses

import jax
import pytest

from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, TrainConfig
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.flops import step_flops
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train import trainer
from hybrid_jax.train.optimizer import make_optimizer
from hybrid_jax.train.trainer import _abstract_train_state, init_train_state, train
from tests.data.corpus_helpers import tiny_text_experiment, write_corpus


def test_a_run_builds_its_model_once_fresh_and_resumed(tmp_path, monkeypatch):
    built = []
    build = LanguageModel.__init__

    def counted(self, *args, **kwargs):
        built.append(type(self))
        build(self, *args, **kwargs)

    monkeypatch.setattr(LanguageModel, "__init__", counted)
    corpus, run = write_corpus(tmp_path / "corpus"), tmp_path / "run"
    fresh = tiny_text_experiment(corpus, steps=1, warmup_steps=1, checkpoint_every=1)
    train(fresh, run, progress=False)
    assert len(built) == 1  # was 3: step_flops, the abstract state, the init jit
    built.clear()
    resumed = tiny_text_experiment(corpus, steps=2, warmup_steps=1, checkpoint_every=1)
    assert train(resumed, run, progress=False, resume=True)["steps"] == 2
    assert len(built) == 1  # was 2: step_flops, the restore target


@pytest.mark.parametrize("preset, scan", [("swa-transformer-tiny", False),
                                          ("nha-hybrid-tiny", True), ("pha-tiny", False)])
def test_flops_from_the_traced_parameters_equal_those_from_the_config(preset, scan,
                                                                      monkeypatch):
    model = presets.get(preset).replace(scan_layers=scan)
    experiment = ExperimentConfig(name="flops", model=model,
                                  data=MQARConfig(vocab_size=model.vocab_size, seq_len=32),
                                  train=TrainConfig(steps=2, warmup_steps=1))
    mesh = make_mesh(MeshConfig(data=1))
    made = []  # the optimizer learns whether the blocks are stacked (its weight-decay mask)
    monkeypatch.setattr(trainer, "make_optimizer",
                        lambda config, **kw: made.append(kw) or make_optimizer(config, **kw))
    abstract = _abstract_train_state(experiment, mesh)
    assert made == [{"scan_layers": scan}]
    assert step_flops(model, 32, abstract.params) == step_flops(model, 32)
    # a TrainState's (what the benchmarks pass), also once its arrays are donated and deleted
    state = init_train_state(experiment, mesh, abstract)
    for leaf in jax.tree.leaves(state.state):
        leaf.delete()
    assert step_flops(model, 32, state.params) == step_flops(model, 32)


def test_a_start_up_that_fails_part_way_closes_what_it_opened(tmp_path, monkeypatch):
    """A failure after the checkpointer and the batch reader were opened (here compiling the
    step) closes both before it comes out; only the checkpointer was closed before, and a
    failure past the metrics log closed neither of them nor the log."""
    from hybrid_jax.train.checkpoint import Checkpointer
    from hybrid_jax.train.prefetch import DevicePrefetcher

    closed = []
    for cls in (Checkpointer, DevicePrefetcher, trainer.MetricsLog):
        def close(self, _close=cls.close, _name=cls.__name__):
            closed.append(_name)
            _close(self)
        monkeypatch.setattr(cls, "close", close)

    def no_progress(*args, **kwargs):
        raise RuntimeError("the progress bar failed")

    monkeypatch.setattr(trainer, "Progress", no_progress)
    corpus = write_corpus(tmp_path / "corpus")
    with pytest.raises(RuntimeError, match="the progress bar failed"):
        train(tiny_text_experiment(corpus, steps=1, warmup_steps=1), tmp_path / "run",
              progress=False)
    assert sorted(closed) == ["Checkpointer", "DevicePrefetcher", "MetricsLog"]


def _tiny_mqar(name, *, steps):
    """transformer-tiny on a small MQAR for `steps` steps, one eval batch."""
    return ExperimentConfig(
        name=name, model=presets.get("transformer-tiny"),
        data=MQARConfig(vocab_size=256, seq_len=16, num_kv_pairs=2),
        train=TrainConfig(steps=steps, warmup_steps=0, batch_size=8, eval_batches=1))


def test_a_resume_past_the_end_drops_the_results_of_that_end(tmp_path, monkeypatch):
    """A finished run resumed with more steps and stopped (a signal, a failure) kept the
    results.json of its earlier end: a complete run at the old step count, beside a config of
    the new one and later checkpoints (drivers read results.json as "finished")."""
    run, experiment = tmp_path / "run", _tiny_mqar("more", steps=1)
    train(experiment, run, progress=False)
    assert (run / "results.json").is_file()

    def stopped(self, stop):  # a signal before the first new step
        stop.received = "SIGTERM"

    monkeypatch.setattr(trainer._Run, "loop", stopped)
    longer = dataclasses.replace(experiment,
                                 train=dataclasses.replace(experiment.train, steps=3))
    assert train(longer, run, progress=False, resume=True)["interrupted"] == "SIGTERM"
    assert not (run / "results.json").exists()


def test_a_resume_refuses_fewer_steps_than_its_checkpoint(tmp_path):
    """`--resume --set train.steps=1` on a run at step 2: it evaluated step 2 and recorded
    steps=1 in config.json, the setting ignored without a word."""
    run, experiment = tmp_path / "run", _tiny_mqar("fewer", steps=2)
    train(experiment, run, progress=False)
    config = (run / "config.json").read_text()
    fewer = dataclasses.replace(experiment, train=dataclasses.replace(experiment.train, steps=1))
    with pytest.raises(ValueError, match=r"^train.steps=1, but the run's latest checkpoint is "
                                         r"step 2: a resume trains on from there"):
        train(fewer, run, progress=False, resume=True)
    assert (run / "config.json").read_text() == config
    assert train(experiment, run, progress=False, resume=True)["steps"] == 2  # as many: fine
