"""Trains an experiment whose third step never finishes (a host callback that sleeps), for the
watchdog tests: `python -m tests.reliability.stuck_driver CONFIG.json RUN_DIR`.

The main thread then waits inside `jax.device_get` for that step's metrics, where Python
signal handlers cannot run, as in a hung device computation.
"""

import json
import signal
import sys
import time

import jax

import hybrid_jax.train.trainer as trainer
from hybrid_jax.config import ExperimentConfig, from_dict

STUCK_STEP = 3


def _sleep_forever(x):
    time.sleep(3600)
    return x


def stuck_steps(ts, *args, **kwargs):
    step_fn, calls = trainer_make_train_step(ts, *args, **kwargs), [0]
    hang = jax.jit(lambda x: jax.pure_callback(_sleep_forever, jax.ShapeDtypeStruct(x.shape,
                                                                                    x.dtype), x))

    def step(state, batch):
        state, metrics = step_fn(state, batch)
        calls[0] += 1
        if calls[0] == STUCK_STEP:
            metrics = {**metrics, "loss": hang(metrics["loss"])}
        return state, metrics

    return step


trainer_make_train_step = trainer.make_train_step


def main() -> int:
    experiment = from_dict(ExperimentConfig, json.loads(open(sys.argv[1]).read()))
    trainer.make_train_step = stuck_steps
    results = trainer.train(experiment, sys.argv[2], progress=False)
    if results.get("interrupted"):
        return 128 + signal.Signals[results["interrupted"]].value
    return 0


if __name__ == "__main__":
    sys.exit(main())
