"""Per-process data sharding: each data-loading process reads only its rows of every global
batch, the rows of all processes make the one-process batch, and an iterator's state resumes
on any number of processes."""

import jax
import numpy as np
import pytest

from hybrid_jax.data.pipeline import eval_batches, process_rows, train_iterator

BATCH = 8


class RecordingData:
    """A data config whose sources are example i = [i]; it records the examples read and the
    (split, seed) of every source asked for."""

    def __init__(self, size: int = 1000):
        self.size, self.reads, self.sources = size, set(), []

    def source(self, split, seed):
        self.sources.append((split, seed))
        data = self

        class Source:
            def __len__(self):
                return data.size

            def __getitem__(self, i):
                data.reads.add(int(i))
                return {"inputs": np.asarray([i], np.int32)}

        return Source()


def batches(count, steps, index=None, data=None, state=None, seed=0):
    data = RecordingData() if data is None else data
    it = train_iterator(data, batch_size=BATCH, seed=seed, shard_index=index, shard_count=count,
                        prefetch=1)
    if state is not None:
        it.set_state(state)
    return [next(it)["inputs"][:, 0] for _ in range(steps)], it


def test_the_seed_shuffles_and_each_epoch_is_a_fresh_shuffle():
    """Every epoch of 32 examples is a permutation of them, in an order the seed sets: another
    seed, or the next epoch, gives another order; the same seed the same batches."""
    def epochs(seed):
        steps, _ = batches(1, 8, data=RecordingData(32), seed=seed)
        flat = np.concatenate(steps)
        return flat[:32], flat[32:]

    first, second = epochs(0)
    for epoch in (first, second):
        assert sorted(epoch.tolist()) == list(range(32))
    assert list(first) != list(second)
    assert list(first) != list(epochs(1)[0])
    assert [list(e) for e in epochs(0)] == [list(first), list(second)]


@pytest.mark.parametrize("count", [2, 4])
def test_each_process_reads_only_its_rows(count):
    full, _ = batches(1, 3)
    rows = BATCH // count
    for index in range(count):
        data = RecordingData()
        own, _ = batches(count, 3, index, data)
        assert [list(b) for b in own] == [list(b[index * rows:(index + 1) * rows]) for b in full]
        # Whatever it prefetched, the process read no example of another process's rows (the
        # first epoch, 1000 examples, has no repeats).
        everyone_else = set(np.concatenate([np.delete(b, np.s_[index * rows:(index + 1) * rows])
                                            for b in full]).tolist())
        assert data.reads and not data.reads & everyone_else


def test_state_resumes_on_another_process_count():
    full, _ = batches(1, 5)
    _, two = batches(2, 3, index=1)
    state = two.get_state()  # after 3 global batches, saved by process 1 of 2
    for count in (1, 4):
        parts = [batches(count, 2, index, state=state)[0] for index in range(count)]
        assert [list(np.concatenate(step)) for step in zip(*parts, strict=True)] == \
            [list(b) for b in full[3:]]


def test_each_split_is_read_with_the_runs_seed():
    """Training reads the train split and evaluation the eval split, each source built with
    the seed it is given (synthetic tasks draw their examples from it)."""
    data = RecordingData()
    batches(1, 1, data=data, seed=5)
    eval_batches(data, batch_size=BATCH, num_batches=1, seed=7)
    assert data.sources == [("train", 5), ("eval", 7)]


def test_a_train_split_smaller_than_a_batch_is_said(caplog):
    with caplog.at_level("WARNING", logger="hybrid_jax.data"):
        (batch,), _ = batches(1, 1, data=RecordingData(size=5))
    assert len(batch) == 8 and sorted(set(batch.tolist())) == [0, 1, 2, 3, 4]
    assert ("the train split has 5 examples, fewer than one batch of 8: every batch holds some "
            "of them more than once") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybrid_jax.data"):
        batches(1, 1)
    assert not [r for r in caplog.records if r.name == "hybrid_jax.data"]


def test_the_default_process_is_this_jax_process(monkeypatch):
    """Without shard_index / shard_count, process 1 of 4 (as JAX reports) reads and keeps the
    rows process 1 of 4 reads when named."""
    full, _ = batches(1, 2, index=0)
    named, _ = batches(4, 2, index=1)
    monkeypatch.setattr(jax, "process_count", lambda: 4)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert [list(b) for b in batches(None, 2)[0]] == [list(b) for b in named] == [
        list(b[2:4]) for b in full]
    assert process_rows({"inputs": np.arange(8)})["inputs"].tolist() == [2, 3]
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by the 4"):
        process_rows({"inputs": np.arange(6)})


def test_process_rows():
    batch = {"inputs": np.arange(8)[:, None], "mask": np.ones((8, 3), bool)}
    part = process_rows(batch, shard_index=2, shard_count=4)
    assert part["inputs"].ravel().tolist() == [4, 5] and part["mask"].shape == (2, 3)
    assert process_rows(batch)["inputs"].shape == (8, 1)  # one process: the whole batch
    with pytest.raises(ValueError, match="batch_size=8 is not divisible by the 3"):
        process_rows(batch, shard_index=0, shard_count=3)


@pytest.mark.parametrize("index, count", [(4, 4), (-1, 4), (0, 0)])
def test_a_shard_index_outside_the_processes_is_refused(index, count):
    """Index 4 of 4 read process 0's rows of the next batch, -1 nothing, count 0 divided by 0."""
    message = rf"shard_index={index}, shard_count={count}: expected 0 <= shard_index < shard_c"
    with pytest.raises(ValueError, match=message):
        train_iterator(RecordingData(), batch_size=BATCH, seed=0, shard_index=index,
                       shard_count=count)
    with pytest.raises(ValueError, match=message):
        process_rows({"inputs": np.arange(8)}, shard_index=index, shard_count=count)


@pytest.mark.parametrize("size, num_batches, expected", [
    (43, 2, 2), (43, 0, 5), (43, 100, 5),  # 0: all; more than there are: all; whole batches
    (8, 0, 1),  # exactly one batch
])
def test_eval_batches_are_the_first_whole_batches_in_order(size, num_batches, expected):
    batches = eval_batches(RecordingData(size), batch_size=BATCH, num_batches=num_batches,
                           seed=0)
    assert [b["inputs"][:, 0].tolist() for b in batches] == [
        list(range(i * BATCH, (i + 1) * BATCH)) for i in range(expected)]


def test_eval_batches_refuse_a_split_shorter_than_a_batch():
    with pytest.raises(ValueError, match="the eval split has 7 examples, fewer than one batch "
                                         "of 8"):
        eval_batches(RecordingData(7), batch_size=BATCH, num_batches=0, seed=0)


def test_an_empty_train_split_is_named():
    """Not an iterator whose first batch is a bare StopIteration."""
    with pytest.raises(ValueError, match="the train split has 0 examples: expected at least"):
        train_iterator(RecordingData(0), batch_size=BATCH, seed=0)
