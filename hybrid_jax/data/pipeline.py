"""grain pipelines from a data config: shuffled, repeated, sharded, batched, prefetched.

A data config provides `source(split, seed)`, a grain random-access source of example dicts
(see `hybrid_jax.data.synthetic`). Training iterators are grain `DatasetIterator`s, whose
`get_state()` / `set_state()` make the data position checkpointable.
"""

from __future__ import annotations

import logging
from typing import Any

import grain
import jax


def _shard(batch_size: int, shard_index: int | None, shard_count: int | None
           ) -> tuple[int, int, int]:
    """(index, count, rows per process) of the data-loading processes (default: this JAX
    process of all of them)."""
    index = jax.process_index() if shard_index is None else shard_index
    count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= index < count:  # another index would read other processes' rows, or none
        raise ValueError(f"shard_index={index}, shard_count={count}: expected 0 <= shard_index "
                         "< shard_count")
    if batch_size % count:
        raise ValueError(f"batch_size={batch_size} is not divisible by the {count} "
                         "data-loading processes")
    return index, count, batch_size // count


def train_iterator(data: Any, *, batch_size: int, seed: int, shard_index: int | None = None,
                   shard_count: int | None = None, prefetch: int = 2) -> grain.DatasetIterator:
    """Endless per-process batches of `batch_size // shard_count` examples.

    Each epoch is a fresh shuffle (seeded). Global batch b is examples b·B .. (b+1)·B − 1 of the
    shuffled stream whatever the process count; process `shard_index` of `shard_count` (default:
    this JAX process) reads only its rows of it (the batches of B/count examples numbered
    b·count + shard_index), so no process loads another's examples. The iterator's state
    counts global batches, so a checkpoint resumes on any number of processes.
    """
    index, count, local = _shard(batch_size, shard_index, shard_count)
    source = data.source("train", seed)
    if len(source) == 0:  # grain's repeat of nothing ends at once: a bare StopIteration
        raise ValueError("the train split has 0 examples: expected at least one")
    if len(source) < batch_size:  # allowed (tiny corpora), but each batch then repeats rows
        logging.getLogger("hybrid_jax.data").warning(
            "the train split has %d examples, fewer than one batch of %d: every batch holds "
            "some of them more than once", len(source), batch_size)
    dataset = (grain.MapDataset.source(source).shuffle(seed=seed).repeat()
               .batch(local, drop_remainder=True)[index::count])
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch)
    return iter(dataset.to_iter_dataset(options))


def process_rows(batch: dict[str, Any], *, shard_index: int | None = None,
                 shard_count: int | None = None) -> dict[str, Any]:
    """This process's rows of a global batch of `[B, ...]` arrays (as `train_iterator` splits
    them): what it hands `jax.make_array_from_process_local_data`."""
    some = next(iter(batch.values()))
    index, _, local = _shard(len(some), shard_index, shard_count)
    return {k: v[index * local:(index + 1) * local] for k, v in batch.items()}


def eval_batches(data: Any, *, batch_size: int, num_batches: int, seed: int) -> list[dict]:
    """The first `num_batches` batches of the eval split, in order (the same every call);
    0: all of them."""
    source = data.source("eval", seed)
    available = len(source) // batch_size
    if available < 1:
        raise ValueError(f"the eval split has {len(source)} examples, fewer than one batch "
                         f"of {batch_size}")
    dataset = grain.MapDataset.source(source).batch(batch_size, drop_remainder=True)
    return [dataset[i] for i in range(min(num_batches or available, available))]
