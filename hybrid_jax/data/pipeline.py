"""grain pipelines from a data config: shuffled, repeated, sharded, batched, prefetched.

A data config provides `source(split, seed)`, a grain random-access source of example dicts
(see `hybrid_jax.data.synthetic`). Training iterators are grain `DatasetIterator`s, whose
`get_state()` / `set_state()` make the data position checkpointable.
"""

from __future__ import annotations

from typing import Any

import grain
import jax


def train_iterator(data: Any, *, batch_size: int, seed: int, shard_index: int | None = None,
                   shard_count: int | None = None, prefetch: int = 2) -> grain.DatasetIterator:
    """Endless per-process batches of `batch_size // shard_count` examples.

    Each epoch is a fresh shuffle (seeded). Process `shard_index` of `shard_count` (default: this
    JAX process) reads a disjoint slice of every global batch.
    """
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
    if batch_size % shard_count:
        raise ValueError(f"batch_size={batch_size} is not divisible by the {shard_count} "
                         "data-loading processes")
    dataset = (grain.MapDataset.source(data.source("train", seed)).shuffle(seed=seed).repeat()
               .batch(batch_size, drop_remainder=True))
    local = batch_size // shard_count
    dataset = dataset.map(lambda b: {k: v[shard_index * local:(shard_index + 1) * local]
                                     for k, v in b.items()})
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch)
    return iter(dataset.to_iter_dataset(options))


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
