"""Gradient accumulation equals the whole-batch step; a step's metrics (loss, accuracy, gradient
norm; zeros for a batch with nothing scored); Oryx modes drawn from the seed and step count, in
the step and in a run's steps; the device prefetcher keeps the iterator state of the batches
handed out, not of those queued ahead."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, ModeSchedule, TrainConfig
from hybrid_jax.context import EXTRA_PREFIX, TokenContext
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.data.pipeline import train_iterator
from hybrid_jax.modes import training_modes
from hybrid_jax.nn import diagnostics
from hybrid_jax.nn.oryx import MODE
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train import trainer
from hybrid_jax.train.loss import mean_loss, token_stats
from hybrid_jax.train.prefetch import DevicePrefetcher
from hybrid_jax.train.trainer import (
    _accumulated_grads,
    evaluate,
    held_out_set,
    init_train_state,
    make_eval_step,
    make_train_step,
    restore_train_state,
    to_device,
    train,
)
from tests.helpers import assert_close


def step_setup(preset: str, vocab_size: int, seed: int, scored: float):
    """An MQAR experiment of `preset` at `vocab_size`, a one-device mesh, and a random batch of
    4 × 12 tokens with about `scored` of its positions in the mask."""
    experiment = ExperimentConfig(name="step", model=presets.get(preset).replace(
        vocab_size=vocab_size), data=MQARConfig(vocab_size=min(vocab_size, 64), seq_len=12,
                                                num_kv_pairs=2),
                                  train=TrainConfig(batch_size=4))
    rng = np.random.default_rng(seed)
    batch = {"inputs": rng.integers(0, vocab_size, (4, 12)),
             "targets": rng.integers(0, vocab_size, (4, 12)), "mask": rng.random((4, 12)) < scored}
    return experiment, make_mesh(MeshConfig(data=1)), batch


@pytest.mark.parametrize("preset", ["transformer-tiny", "pha-tiny"])
def test_grad_accumulation_matches_one_batch(preset):
    """Also the diagnostics (pha's learned mixing weights: their mean over micro-batches)."""
    experiment, mesh, batch = step_setup(preset, 256, seed=0, scored=0.8)
    batch["segment_ids"] = np.repeat([[1] * 5 + [2] * 7], 4, 0)
    states, metrics = [], []
    with jax.set_mesh(mesh):
        for parts in (1, 2):
            ts = init_train_state(experiment, mesh)
            state, m = make_train_step(ts, parts)(ts.state, to_device(batch, mesh))
            states.append(jax.tree.leaves(state))
            metrics.append(m)
    assert_close(metrics[1], metrics[0], 1e-5, "metrics")
    assert any(key.startswith("diag/") for key in metrics[0]) == (preset == "pha-tiny")
    assert_close(states[1], states[0], 1e-5, "state after one step")


def test_step_metrics_are_the_batch_loss_and_accuracy():
    """The logged loss and accuracy of a step are the pre-update model's mean cross entropy and
    share of correct argmax predictions over the scored positions (numpy from its logits)."""
    experiment, mesh, batch = step_setup("transformer-tiny", 16, seed=1, scored=0.7)
    with jax.set_mesh(mesh):
        ts = init_train_state(experiment, mesh)
        model = ts.model()
        logits = np.asarray(model(jnp.asarray(batch["inputs"], jnp.int32)), np.float64)
        grads = nnx.jit(nnx.grad(lambda m: mean_loss(token_stats(
            m(jnp.asarray(batch["inputs"], jnp.int32)), batch["targets"], batch["mask"]))))(model)
        grad_norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2)
                                for g in jax.tree.leaves(grads)))
        _, metrics = make_train_step(ts)(ts.state, to_device(batch, mesh))
    mask = batch["mask"]
    shifted = logits - logits.max(-1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(-1)) - np.take_along_axis(
        shifted, batch["targets"][..., None], -1)[..., 0]
    correct = logits.argmax(-1) == batch["targets"]
    assert 0 < correct[mask].sum() < mask.sum()  # so a changed denominator would show
    np.testing.assert_allclose(float(metrics["loss"]), nll[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["accuracy"]), correct[mask].mean(), rtol=1e-6)
    # grad_norm: the global norm of that loss's gradient (not of the parameters, nor updates)
    np.testing.assert_allclose(float(metrics["grad_norm"]), grad_norm, rtol=1e-4)


def test_logged_grad_norm_is_of_the_trained_parameters():
    """With `train.freeze` the logged norm is the one clipping reads, the trained parameters'
    (it counted the frozen ones too): frozen embedding + frozen rest = the whole, squared."""
    experiment, mesh, batch = step_setup("transformer-tiny", 16, seed=1, scored=0.7)
    norms = {}
    with jax.set_mesh(mesh):
        for freeze in ("", "embed", "^(?!embed)"):
            ts = init_train_state(experiment, mesh)
            _, metrics = make_train_step(ts, freeze=freeze)(ts.state, to_device(batch, mesh))
            norms[freeze] = float(metrics["grad_norm"])
    assert 0 < norms["embed"] < norms[""] and 0 < norms["^(?!embed)"] < norms[""]
    np.testing.assert_allclose(norms["embed"] ** 2 + norms["^(?!embed)"] ** 2, norms[""] ** 2,
                               rtol=1e-4)


@pytest.mark.parametrize("parts", [1, 2])
def test_a_batch_with_nothing_scored_is_a_zero_step(parts):
    """No scored position: loss, accuracy and gradient 0 (not 0/0 = NaN, which would stop the
    run), whole-batch or accumulated; the parameters stay finite."""
    experiment, mesh, batch = step_setup("transformer-tiny", 16, seed=2, scored=0.0)
    assert not batch["mask"].any()
    with jax.set_mesh(mesh):
        ts = init_train_state(experiment, mesh)
        state, metrics = make_train_step(ts, parts)(ts.state, to_device(batch, mesh))
    assert {k: float(v) for k, v in metrics.items()} == {"loss": 0.0, "accuracy": 0.0,
                                                         "grad_norm": 0.0}
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(jax.device_get(state)))


def loss_under_modes(ts, state, batch, modes):
    """The mean loss on `batch` of the model in `state` under the per-token `modes`."""
    context = TokenContext.from_batch({**batch, f"{EXTRA_PREFIX}{MODE}": modes})
    logits = nnx.merge(ts.graphdef, state)[0](jnp.asarray(batch["inputs"]), context)
    return mean_loss(token_stats(logits, batch["targets"], batch["mask"]))


def test_oryx_modes_are_drawn_from_the_seed_and_step_count():
    """Training step n runs the model under `training_modes(schedule, shape, seed, n - 1)`
    (its loss is the model's under those modes); every eval step under those of step 0."""
    schedule, seed = ModeSchedule(pattern="random_chunks", chunk=4), 3
    experiment, mesh, batch = step_setup("oryx-gdn-tiny", 32, seed=3, scored=0.8)
    draws = [np.asarray(training_modes(schedule, (4, 12), s, n)) for s, n in
             ((seed, 0), (seed, 1), (0, 0))]
    assert not np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[0], draws[2])

    with jax.set_mesh(mesh):
        ts = init_train_state(experiment, mesh)
        loss_under = jax.jit(lambda state, modes: loss_under_modes(ts, state, batch, modes))
        step = make_train_step(ts, modes=schedule, seed=seed)
        eval_step = make_eval_step(ts, schedule, seed)
        state, expected = ts.state, []
        for _ in range(2):
            expected.append([float(loss_under(state, draw)) for draw in draws])
            stats = jax.device_get(eval_step(state, to_device(batch, mesh)))
            assert stats["loss_sum"] / stats["count"] == pytest.approx(expected[-1][0], rel=1e-5)
            state, metrics = step(state, to_device(batch, mesh))
            assert float(metrics["loss"]) == pytest.approx(expected[-1][len(expected) - 1],
                                                           rel=1e-5)
    assert len({round(loss, 5) for loss in expected[1]}) == 3  # each draw shows in the loss


def test_a_run_steps_and_evaluates_under_its_options(tmp_path, monkeypatch):
    """`train.grad_accum`, `mode_schedule` and `seed` reach the run's steps: its one step
    (logged as the last, though 1 is no multiple of log_every) accumulates 2 micro-batches and
    its loss is the initial model's on the first batch under the modes of (seed, step 0); its
    eval is the final model's on `eval_batches` held-out batches under those modes too."""
    schedule = ModeSchedule(pattern="random_chunks", chunk=4)
    experiment = ExperimentConfig(
        name="options", model=presets.get("oryx-gdn-tiny").replace(vocab_size=32),
        data=MQARConfig(vocab_size=32, seq_len=12, num_kv_pairs=2),
        train=TrainConfig(steps=1, batch_size=4, grad_accum=2, seed=3, warmup_steps=0,
                          log_every=2, eval_batches=2, mode_schedule=schedule,
                          mesh=MeshConfig(data=1)))
    parts, accumulate = [], trainer._accumulated_grads
    monkeypatch.setattr(trainer, "_accumulated_grads",
                        lambda model, batch, n: parts.append(n) or accumulate(model, batch, n))
    results = train(experiment, tmp_path, progress=False)
    assert parts == [2]  # traced once
    batch = next(train_iterator(experiment.data, batch_size=4, seed=3))
    modes = training_modes(schedule, (4, 12), 3, 0)
    mesh = make_mesh(MeshConfig(data=1))
    with jax.set_mesh(mesh):
        initial = init_train_state(experiment, mesh)
        loss = float(jax.jit(lambda s: loss_under_modes(initial, s, batch, modes))(initial.state))
        final, _ = restore_train_state(experiment, tmp_path, mesh)
        held_out, _ = held_out_set(experiment.data, 4, 2, 3)
        final_eval = evaluate(final, held_out, make_eval_step(final, schedule, 3))
    assert results["train_loss"] == pytest.approx(loss, rel=1e-5)
    assert results["eval_loss"] == pytest.approx(final_eval["loss"], rel=1e-6)


class InputMean(nnx.Module):
    """A one-table model that reports the mean input id of each call as a diagnostic."""

    def __init__(self):
        self.table = nnx.Param(jnp.zeros((8, 8)))

    def __call__(self, tokens, context):
        diagnostics.report(self, "input_mean", jnp.mean(tokens.astype(jnp.float32)))
        return self.table[...][tokens]


def test_accumulated_diagnostics_are_the_mean_over_micro_batches():
    batch = {"inputs": jnp.asarray([[1, 1], [5, 7]]), "targets": jnp.zeros((2, 2), jnp.int32),
             "mask": jnp.ones((2, 2), bool)}
    *_, reported = _accumulated_grads(InputMean(), batch, 2)
    assert {k: float(v) for k, v in reported.items()} == {"input_mean": (1 + 6) / 2}


class Counter:
    """A checkpointable iterator over 0, 1, 2, ..."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        self.position += 1
        return self.position - 1

    def get_state(self):
        return self.position

    def set_state(self, state):
        self.position = state


@pytest.mark.parametrize("depth", [0, 3])
def test_prefetcher_state_is_of_the_batches_handed_out(depth):
    prefetcher = DevicePrefetcher(Counter(), lambda x: jnp.asarray(x) * 10, depth=depth)
    assert [int(next(prefetcher)) for _ in range(4)] == [0, 10, 20, 30]
    assert prefetcher.get_state() == 4  # the thread may have read further ahead
    prefetcher.set_state(1)
    assert [int(next(prefetcher)) for _ in range(2)] == [10, 20]
    assert prefetcher.get_state() == 3
    prefetcher.close()


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetcher_reads_at_most_depth_ahead_in_its_thread(depth):
    """depth 0: every batch placed in the caller's thread, nothing read ahead; depth d (1
    too): placed by the prefetch thread, at most d queued plus the one in its hands."""
    threads = set()

    def put(x):
        threads.add(threading.current_thread().name)
        return x

    counter = Counter()
    prefetcher = DevicePrefetcher(counter, put, depth=depth)
    assert next(prefetcher) == 0
    time.sleep(0.3)  # the thread fills its queue
    assert counter.position <= (1 if depth == 0 else 1 + depth + 1)
    assert threads == {threading.current_thread().name if depth == 0 else "device-prefetch"}
    prefetcher.close()


def test_prefetcher_refuses_a_negative_depth():
    with pytest.raises(ValueError, match="prefetch depth must be >= 0, got -1"):
        DevicePrefetcher(Counter(), lambda x: x, depth=-1)


def test_prefetcher_raises_the_readers_error():
    class Broken(Counter):
        def __next__(self):
            raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        next(DevicePrefetcher(Broken(), lambda x: x, depth=2))


def test_prefetcher_hands_on_a_base_exception_too():
    """A reader raising a BaseException that is no Exception (SystemExit) still reaches the
    consumer: it does not end the thread silently and leave `next` waiting forever."""
    class Exiting(Counter):
        def __next__(self):
            raise SystemExit("reader quit")

    prefetcher = DevicePrefetcher(Exiting(), lambda x: x, depth=2)
    raised = []

    def consume():
        try:
            next(prefetcher)
        except SystemExit as error:
            raised.append(str(error))

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    consumer.join(5.0)
    assert raised == ["reader quit"]
    prefetcher.close()


def test_a_prefetcher_read_past_its_error_reads_on():
    """After the reader's error (an exhausted finite iterator: StopIteration) reached the
    consumer, the next call reads the iterator again, as depth 0 does, instead of waiting
    forever on the ended thread's queue."""
    class Two(Counter):
        def __next__(self):
            if self.position >= 2:
                raise StopIteration
            return super().__next__()

    prefetcher = DevicePrefetcher(Two(), lambda x: x, depth=2)
    assert list(prefetcher) == [0, 1]
    again = []
    reader = threading.Thread(target=lambda: again.append(list(prefetcher)), daemon=True)
    reader.start()
    reader.join(5.0)
    assert again == [[]], "the second pass hangs on the ended thread"
    prefetcher.close()


def test_a_reader_error_behind_a_full_queue_does_not_hang_a_restore():
    """The thread fails reading while its queue is full (depth 1: batch 1 queued, batch 2
    raises): `set_state` and `close` still return, and the restored prefetcher reads on."""
    class TwoThenBroken(Counter):
        def __next__(self):
            if self.position >= 2:
                raise OSError("disk gone")
            return super().__next__()

    prefetcher = DevicePrefetcher(TwoThenBroken(), lambda x: x, depth=1)
    assert next(prefetcher) == 0
    time.sleep(0.3)  # batch 1 queued, the read of batch 2 failed
    restore = threading.Thread(target=prefetcher.set_state, args=(0,), daemon=True)
    restore.start()
    restore.join(5.0)
    assert not restore.is_alive(), "set_state hangs behind the failed thread"
    assert [next(prefetcher) for _ in range(2)] == [0, 1]
    with pytest.raises(OSError, match="disk gone"):
        next(prefetcher)
    prefetcher.close()


@pytest.mark.parametrize("depth", [0, 3])
def test_prefetcher_state_before_any_batch_is_the_iterators(depth):
    """A checkpoint saved before the first batch, or right after a restore and before the next
    batch, records the iterator's position at that moment (a resume starts there), not None
    or the position before the restore."""
    counter = Counter()
    counter.position = 5
    prefetcher = DevicePrefetcher(counter, lambda x: x, depth=depth)
    assert prefetcher.get_state() == 5
    assert next(prefetcher) == 5
    prefetcher.set_state(2)
    assert prefetcher.get_state() == 2
    assert [next(prefetcher) for _ in range(2)] == [2, 3]
    prefetcher.close()


@pytest.mark.parametrize("depth", [0, 2])
def test_a_closed_prefetcher_refuses_to_read_on(depth):
    """`next` after `close` raises: it started another thread where the closed one stopped,
    past the batches it had queued and `close` dropped, so a run skipped them silently."""
    prefetcher = DevicePrefetcher(Counter(), lambda x: x, depth=depth)
    assert next(prefetcher) == 0
    time.sleep(0.2)  # the thread reads ahead
    prefetcher.close()
    with pytest.raises(RuntimeError, match="DevicePrefetcher is closed: the batches it had"):
        next(prefetcher)
    assert prefetcher.get_state() == 1  # still the position after the last batch handed out
    prefetcher.close()  # twice is fine
