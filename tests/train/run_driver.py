"""Runs `train(..., resume=True)` in a subprocess for the preemption tests.

    python -m tests.train.run_driver CONFIG.json RUN_DIR SECONDS_PER_BATCH

The experiment comes from CONFIG.json; each batch is delayed by SECONDS_PER_BATCH so a test can
signal the run midway. A multi-process job is set by the `HYBRID_JAX_*` environment
(`hybrid_jax.distributed`). Prints `{"interrupted": ..., "step": ...}` and exits 128 + signal
number when interrupted, like `hybrid-jax train`.
"""

import json
import signal
import sys
import time

import hybrid_jax.train.trainer as trainer
from hybrid_jax.config import ExperimentConfig, from_dict
from hybrid_jax.distributed import initialize
from tests.unrolled_threefry import use_unrolled_threefry


class SlowBatches:
    """A grain iterator whose `next` sleeps first (the state methods pass through)."""

    def __init__(self, iterator, delay: float):
        self.iterator, self.delay = iterator, delay

    def __next__(self):
        time.sleep(self.delay)
        return next(self.iterator)

    def get_state(self):
        return self.iterator.get_state()

    def set_state(self, state):
        self.iterator.set_state(state)


def main() -> int:
    config, run_dir, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    initialize()  # a multi-process job when the environment describes one
    use_unrolled_threefry()  # as in the test process (conftest.py): the same bits, cheaper
    experiment = from_dict(ExperimentConfig, json.loads(open(config).read()))
    make_iterator = trainer.train_iterator
    trainer.train_iterator = lambda *a, **k: SlowBatches(make_iterator(*a, **k), delay)
    results = trainer.train(experiment, run_dir, progress=False, resume=True)
    if results.get("interrupted"):
        print(json.dumps({k: results[k] for k in ("interrupted", "step")}), flush=True)
        return 128 + signal.Signals[results["interrupted"]].value
    return 0


if __name__ == "__main__":
    sys.exit(main())
