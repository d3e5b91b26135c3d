"""The training loop: one jitted step (NNX merge/split inside jit) under a device mesh.

Outputs in the run directory: `config.json` (the experiment), `metrics.jsonl` (one line per log
step), `results.json` (final metrics) and `checkpoints/` (model + optimizer state).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from hybrid_jax.config import ExperimentConfig, to_dict
from hybrid_jax.data.pipeline import eval_batches, train_iterator
from hybrid_jax.nn.lm import LanguageModel, count_params
from hybrid_jax.sharding import batch_sharding, make_mesh, state_shardings
from hybrid_jax.train.checkpoint import Checkpointer
from hybrid_jax.train.loss import mean_loss, token_stats
from hybrid_jax.train.metrics import MetricsLog, Progress
from hybrid_jax.train.optimizer import learning_rate_schedule, make_optimizer


@dataclasses.dataclass
class TrainState:
    """A model and its optimizer as (graphdef, state); `state` is the only thing that changes."""

    graphdef: nnx.GraphDef
    state: nnx.State
    shardings: nnx.State
    mesh: Mesh

    def model(self) -> LanguageModel:
        return nnx.merge(self.graphdef, self.state)[0]


def _abstract_train_state(experiment: ExperimentConfig, mesh: Mesh):
    tx = make_optimizer(experiment.train)

    def init():
        model = LanguageModel(experiment.model, rngs=nnx.Rngs(experiment.train.seed))
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    graphdef, abstract_state = nnx.split(nnx.eval_shape(init))
    return graphdef, abstract_state, state_shardings(abstract_state, mesh), init


def init_train_state(experiment: ExperimentConfig, mesh: Mesh) -> TrainState:
    """Creates model and optimizer in one compiled call, each array in its mesh sharding."""
    graphdef, _, shardings, init = _abstract_train_state(experiment, mesh)
    with jax.set_mesh(mesh):
        state = jax.jit(lambda: nnx.split(init())[1], out_shardings=shardings)()
    return TrainState(graphdef, state, shardings, mesh)


def restore_train_state(experiment: ExperimentConfig, run_dir: str | Path, mesh: Mesh, *,
                        step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
    """Loads a run's checkpoint (latest, or `step`) onto `mesh`, whatever mesh saved it."""
    graphdef, abstract_state, shardings, _ = _abstract_train_state(experiment, mesh)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_state, shardings)
    checkpointer = Checkpointer(Path(run_dir))
    try:
        state, meta, _ = checkpointer.restore(target, step)
    finally:
        checkpointer.close()
    return TrainState(graphdef, state, shardings, mesh), meta


def _batch_inputs(model: LanguageModel, batch: dict[str, jax.Array]) -> jax.Array:
    return model(batch["inputs"], positions_BT=batch.get("positions"),
                 segment_ids_BT=batch.get("segment_ids"))


def make_train_step(ts: TrainState) -> Callable:
    """`state, metrics = step(state, batch)`; donates the old state."""

    def step(state: nnx.State, batch: dict[str, jax.Array]):
        model, optimizer = nnx.merge(ts.graphdef, state)

        def loss_fn(model):
            stats = token_stats(_batch_inputs(model, batch), batch["targets"], batch["mask"])
            return mean_loss(stats), stats

        (loss, stats), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        metrics = {"loss": loss, "accuracy": stats["correct"] / jnp.maximum(stats["count"], 1.0),
                   "grad_norm": optax.tree.norm(grads)}
        return nnx.state((model, optimizer)), metrics

    return jax.jit(step, donate_argnums=0, out_shardings=(ts.shardings, None))


def make_eval_step(ts: TrainState) -> Callable:
    """`stats = eval_step(state, batch)`: summed loss / correct / count over scored positions."""

    def eval_step(state: nnx.State, batch: dict[str, jax.Array]):
        model = nnx.merge(ts.graphdef, state)[0]
        return token_stats(_batch_inputs(model, batch), batch["targets"], batch["mask"])

    return jax.jit(eval_step)


def to_device(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Places this process's slice of a global batch on the mesh (batch over data axes)."""
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)),
                                                      np.asarray(v))
            for k, v in batch.items()}


def evaluate(ts: TrainState, batches: list[dict[str, np.ndarray]],
             eval_step: Callable | None = None) -> dict[str, float]:
    """Mean loss, perplexity and accuracy over the scored positions of `batches`."""
    eval_step = make_eval_step(ts) if eval_step is None else eval_step
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    with jax.set_mesh(ts.mesh):
        for batch in batches:
            stats = jax.device_get(eval_step(ts.state, to_device(batch, ts.mesh)))
            for key in totals:
                totals[key] += float(stats[key])
    count = max(totals["count"], 1.0)
    loss = totals["loss_sum"] / count
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)),
            "accuracy": totals["correct"] / count, "tokens": totals["count"]}


class NonFiniteLossError(FloatingPointError):
    pass


def _check_data(experiment: ExperimentConfig) -> None:
    data_vocab = getattr(experiment.data, "vocab_size", None)
    if data_vocab is not None and data_vocab > experiment.model.vocab_size:
        raise ValueError(f"data.vocab_size={data_vocab} exceeds model.vocab_size="
                         f"{experiment.model.vocab_size}")


def train(experiment: ExperimentConfig, out_dir: str | Path | None = None, *,
          progress: bool = True) -> dict[str, Any]:
    """Trains `experiment`, evaluates it, and returns the final metrics (also in results.json)."""
    _check_data(experiment)
    cfg = experiment.train
    out = None if out_dir is None else Path(out_dir)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(experiment), indent=2))
    mesh = make_mesh(cfg.mesh)
    ts = init_train_state(experiment, mesh)
    step_fn, eval_step = make_train_step(ts), make_eval_step(ts)
    batches = train_iterator(experiment.data, batch_size=cfg.batch_size, seed=cfg.seed)
    held_out = eval_batches(experiment.data, batch_size=cfg.batch_size,
                            num_batches=cfg.eval_batches, seed=cfg.seed)
    schedule = learning_rate_schedule(cfg)
    log = MetricsLog(out)
    bar = Progress(cfg.steps, enabled=progress)
    tokens_per_step = cfg.batch_size * _seq_len(experiment)
    pending: tuple[int, dict] | None = None  # metrics read one step late, keeping dispatch async
    last_time, last_step, start = time.perf_counter(), 0, time.perf_counter()

    def flush(step: int, metrics: dict) -> None:
        nonlocal last_time, last_step
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not math.isfinite(values["loss"]):
            raise NonFiniteLossError(f"non-finite loss {values['loss']} at step {step}")
        if step % max(cfg.log_every, 1) == 0 or step == cfg.steps:
            now = time.perf_counter()
            values["tokens_per_s"] = tokens_per_step * (step - last_step) / (now - last_time)
            values["lr"] = float(schedule(step))
            last_time, last_step = now, step
            log.write({"step": step, **values})
            bar.log(step, {"loss": values["loss"], "acc": values["accuracy"],
                           "tok/s": values["tokens_per_s"]})

    with jax.set_mesh(mesh):
        for step in range(1, cfg.steps + 1):
            ts.state, metrics = step_fn(ts.state, to_device(next(batches), mesh))
            if pending is not None:
                flush(*pending)
            pending = (step, metrics)
            bar.update()
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                log.write({"step": step, **{f"eval_{k}": v for k, v in
                                            evaluate(ts, held_out, eval_step).items()}})
        flush(*pending)
    bar.close()
    final = evaluate(ts, held_out, eval_step)
    results = {"experiment": experiment.name, "steps": cfg.steps,
               "params": count_params(ts.model()),
               "train_loss": log.history[-1]["loss"] if log.history else None,
               **{f"eval_{k}": v for k, v in final.items()},
               "accuracy": final["accuracy"], "wall_time_s": time.perf_counter() - start}
    log.write({"step": cfg.steps, **{f"eval_{k}": v for k, v in final.items()}})
    if out is not None:
        checkpointer = Checkpointer(out)
        checkpointer.save(cfg.steps, ts.state, {"step": cfg.steps})
        checkpointer.close()
        (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _seq_len(experiment: ExperimentConfig) -> int:
    return int(getattr(experiment.data, "seq_len", 0))
