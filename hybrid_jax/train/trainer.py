"""The training loop: one jitted step (NNX merge/split inside jit) under a device mesh.

Outputs in the run directory: `config.json` (the experiment), `tokenizer.json` (text data),
`metrics.jsonl` and `tensorboard/` (one record per log step and eval, with every module
diagnostic as `diag/...`, see `hybrid_jax.nn.diagnostics`), `results.json` (final
metrics) and `checkpoints/` (model, optimizer, step, data-iterator state; see `checkpoint.py`).

`train(..., resume=True)` continues from the latest intact checkpoint (a damaged later one is moved
to `damaged_checkpoints/`, saying so) so that every loss after it is the one the uninterrupted run
logs (same device kind). SIGTERM / SIGINT checkpoint and stop the run (`results["interrupted"]`);
if the loop cannot get there within `train.stop_grace_s` (stuck in a device computation), or on a
second signal, the logs are flushed and the process exits with 128 + signal. One that comes after
the last step (during the final checkpoint or evaluation) is raised again once `results.json` is
written, for the handlers outside `train`. A non-finite loss or gradient stops the run naming the
step and which of the two it was, or with `train.on_nonfinite=rollback` restores the last
checkpoint and skips that step's batch. `train.time_limit_s` ends the loop early at a step boundary
(a budgeted run): it checkpoints and evaluates as at the end, and `results["time_limit_reached"]`
says so (`steps` is the step reached; the learning-rate schedule stays the one of `train.steps`).
One process at a time writes a run directory (`run_dir.RunLock`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from jax.sharding import Mesh

from hybrid_jax.config import ExperimentConfig, ModeSchedule, as_json, from_dict, to_dict
from hybrid_jax.context import EXTRA_PREFIX, TokenContext
from hybrid_jax.data.pipeline import eval_batches, process_rows, train_iterator
from hybrid_jax.data.text import TOKENIZER_FILE, TextConfig, check_put_tokenizer
from hybrid_jax.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from hybrid_jax.distributed import is_main_process
from hybrid_jax.files import write_atomic
from hybrid_jax.flops import device_peak_flops, step_flops
from hybrid_jax.modes import attention_fraction, batch_modes, check_reads_modes, with_modes
from hybrid_jax.nn import diagnostics
from hybrid_jax.nn.init_random import fast_random_compile
from hybrid_jax.nn.lm import LanguageModel, count_params
from hybrid_jax.nn.oryx import ATTENTION, MODE
from hybrid_jax.sharding import (
    axis_rules,
    batch_sharding,
    check_batch_split,
    check_seq_split,
    current_rules,
    make_mesh,
    state_shardings,
    use_rules,
)
from hybrid_jax.train.checkpoint import (
    Checkpointer,
    CheckpointError,
    DamagedCheckpointError,
    saved_steps,
)
from hybrid_jax.train.loss import mean_loss, token_stats
from hybrid_jax.train.metrics import MetricsLog, Progress, read_metrics, write_results
from hybrid_jax.train.optimizer import (
    check_freeze,
    learning_rate_schedule,
    make_optimizer,
    trained_norm,
)
from hybrid_jax.train.preemption import StopSignals
from hybrid_jax.train.prefetch import DevicePrefetcher
from hybrid_jax.train.run_dir import (
    RunLock,
    lock_holder,
    make_run_dir,
    prepare_run_dir,
    run_outputs,
    undo_failed_start,
)

log = logging.getLogger(__name__)
MAX_ROLLBACKS = 3  # per process: a run that keeps diverging stops instead of looping


@dataclasses.dataclass
class TrainState:
    """A model and its optimizer as (graphdef, state); `state` is the only thing that changes."""

    graphdef: nnx.GraphDef
    state: nnx.State
    shardings: nnx.State
    mesh: Mesh

    def model(self) -> LanguageModel:
        return nnx.merge(self.graphdef, self.state)[0]

    @property
    def params(self) -> nnx.State:
        """The model's parameters (e.g. for `hybrid_jax.flops.step_flops`, which reads shapes:
        those of donated, deleted arrays too)."""
        return nnx.filter_state(self.state[0], nnx.Param)


class AbstractTrainState(NamedTuple):
    """A run's model and optimizer traced once, shapes only: initialising (`init`, replayed in
    one compiled call), restoring a checkpoint and counting FLOPs all start from it, so none of
    them builds the model again (a deep model's trace takes seconds)."""

    graphdef: nnx.GraphDef
    state: nnx.State  # jax.ShapeDtypeStruct values
    shardings: nnx.State
    init: ClosedJaxpr  # () -> the leaves of `state`: the initial values

    @property
    def params(self) -> nnx.State:
        """The model's parameters (shapes only)."""
        return nnx.filter_state(self.state[0], nnx.Param)


def _abstract_train_state(experiment: ExperimentConfig, mesh: Mesh) -> AbstractTrainState:
    tx = make_optimizer(experiment.train, scan_layers=experiment.model.scan_layers)
    graphdefs = []

    def init() -> nnx.State:
        model = LanguageModel(experiment.model, rngs=nnx.Rngs(experiment.train.seed))
        graphdef, state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
        graphdefs.append(graphdef)  # static: taken out of the trace beside its outputs
        return state

    with jax.set_mesh(mesh):  # traced where the initialisation will run
        jaxpr, state = jax.make_jaxpr(init, return_shape=True)()
    return AbstractTrainState(graphdefs[0], state, state_shardings(state, mesh), jaxpr)


def init_train_state(experiment: ExperimentConfig, mesh: Mesh,
                     abstract: AbstractTrainState | None = None) -> TrainState:
    """Creates model and optimizer in one compiled call, each array in its mesh sharding.

    `abstract`: the run's `_abstract_train_state(experiment, mesh)`, if already traced."""
    if abstract is None:
        abstract = _abstract_train_state(experiment, mesh)
    graphdef, state, shardings, jaxpr = abstract
    structure = jax.tree.structure(state)
    with jax.set_mesh(mesh), fast_random_compile(mesh):
        state = jax.jit(lambda: jax.tree.unflatten(structure, jaxpr_as_fun(jaxpr)()),
                        out_shardings=shardings)()
    return TrainState(graphdef, state, shardings, mesh)


def _restore(abstract: AbstractTrainState, checkpointer: Checkpointer, mesh: Mesh,
             step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
    graphdef, abstract_state, shardings, _ = abstract
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_state, shardings)
    state, meta, _ = checkpointer.restore(target, step)
    return TrainState(graphdef, state, shardings, mesh), meta


def check_tokenizer(meta: dict[str, Any], tokenizer: Any, where: Path) -> None:
    """Refuses a tokenizer other than the one checkpoint `meta` was trained with."""
    saved = meta.get("tokenizer_sha256")
    if saved is None or tokenizer is None:
        return
    found = tokenizer_fingerprint(tokenizer)
    if found != saved:
        raise CheckpointError(
            f"{where} is not the tokenizer checkpoint step {meta['step']} was trained with "
            f"(fingerprint {found[:12]}, the checkpoint recorded {saved[:12]}): restore the "
            "run's own tokenizer.json")


def changed_data_settings(saved: dict[str, Any] | None, experiment: ExperimentConfig
                          ) -> list[str]:
    """The settings that decide what a saved data position reads (every `data.*`,
    `train.batch_size`, `train.seed`) which differ between checkpoint config `saved` and
    `experiment`: a resume keeps the position (a count of global batches), so after such a
    change it reads other examples than the run would have read next."""
    if saved is None:
        return []
    saved, now = _as_json_pair(saved, experiment)
    changed = [f"data.{k}" for k in sorted(set(now["data"]) | set(saved["data"]))
               if now["data"].get(k) != saved["data"].get(k)]
    return changed + [f"train.{k}" for k in ("batch_size", "seed")
                      if now["train"][k] != saved["train"][k]]


def changed_model_settings(saved: dict[str, Any] | None, experiment: ExperimentConfig
                           ) -> list[str]:
    """The `model.*` settings that differ between checkpoint config `saved` and `experiment`:
    a resume may change some (a window, RoPE), so an older step loaded with the run's current
    config.json is not the model it was trained as."""
    if saved is None:
        return []
    saved, now = _as_json_pair(saved, experiment)
    return [f"model.{k}" for k in sorted(set(now["model"]) | set(saved["model"]))
            if now["model"].get(k) != saved["model"].get(k)]


def _as_json_pair(saved: dict[str, Any], experiment: ExperimentConfig
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    # Parsed first: fields added since the checkpoint was written read as their defaults.
    return as_json(from_dict(ExperimentConfig, saved)), as_json(experiment)


def restore_train_state(experiment: ExperimentConfig, run_dir: str | Path, mesh: Mesh, *,
                        step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
    """Loads a run's checkpoint (latest, or `step`) onto `mesh`, whatever mesh saved it.

    A text run's `tokenizer.json` must be the one the checkpoint was trained with."""
    run_dir = Path(run_dir)
    if not saved_steps(run_dir):
        raise FileNotFoundError(_no_checkpoint_yet(run_dir, experiment))
    checkpointer = Checkpointer(run_dir, keep=None, read_only=True)
    try:
        with use_rules(axis_rules(experiment.train.mesh)):
            ts, meta = _restore(_abstract_train_state(experiment, mesh), checkpointer,
                                mesh, step)
    finally:
        checkpointer.close()
    if meta.get("tokenizer_sha256") is not None:
        path = run_dir / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: checkpoint step {meta['step']} was "
                                    "trained with a tokenizer recorded there")
        check_tokenizer(meta, load_tokenizer(path), path)
    return ts, meta


def _no_checkpoint_yet(run_dir: Path, experiment: ExperimentConfig) -> str:
    """Why a load of `run_dir` finds no checkpoint, and what to do: its training may still be
    running, before its first save (train.checkpoint_every), or have stopped before one."""
    folder = run_dir / "checkpoints"
    found = ["its config.json"] if (run_dir / "config.json").is_file() else []
    try:
        logged = [r["step"] for r in read_metrics(run_dir) if "event" not in r]
    except (OSError, UnicodeDecodeError):
        logged = []
    if logged:
        found.append(f"metrics logged up to step {max(logged)}")
    where = f"{folder} holds no saved step" if folder.is_dir() else f"{folder} does not exist"
    what = f"it holds {' and '.join(found)}, but {where}" if found else where
    every = experiment.train.checkpoint_every
    saves = (f"a run saves every train.checkpoint_every={every} steps and at its end"
             if every else "with train.checkpoint_every=0 a run saves only at its end or when "
             "interrupted by Ctrl-C or SIGTERM")
    holder = lock_holder(run_dir)
    if holder is not None and holder.activity not in ("", "training"):
        state = (f"process {holder.pid} is {holder.activity} there and has not saved it yet: "
                 "wait for it to finish")
    elif holder is not None:
        state = (f"its training is running (process {holder.pid}) and has not saved its first "
                 f"checkpoint yet ({saves}): wait for that save")
    else:
        state = (f"no training is running there: it stopped before its first checkpoint "
                 f"({saves}), or none started; train it again with hybrid-jax train "
                 f"{experiment.name} --out {run_dir} --resume")
    return f"no checkpoint found in {run_dir}: {what}; {state}"


def _batch_inputs(model: LanguageModel, batch: dict[str, jax.Array]) -> jax.Array:
    return model(batch["inputs"], TokenContext.from_batch(batch))


def make_train_step(ts: TrainState, grad_accum: int = 1,
                    modes: ModeSchedule | None = None, seed: int = 0,
                    freeze: str = "") -> Callable:
    """`state, metrics = step(state, batch)`; donates the old state. The logged `grad_norm` is
    that of the trained parameters (`freeze`: `train.freeze`), the norm clipping reads.

    `modes`: Oryx's per-token mode schedule, drawn in the step from `seed` and the optimizer's
    step count (`hybrid_jax.modes`), added to the batch as the context extra "mode".

    `grad_accum` > 1 splits the batch into that many micro-batches (a `lax.scan`, so one of them
    is live at a time) and applies the gradient of their summed loss / count once.
    """

    def step(state: nnx.State, batch: dict[str, jax.Array]):
        model, optimizer = nnx.merge(ts.graphdef, state)
        batch = with_modes(batch, modes or ModeSchedule(), seed, optimizer.step[...])
        if grad_accum == 1:
            def loss_fn(model):
                logits, reported = diagnostics.recorded(lambda m: _batch_inputs(m, batch), model)
                stats = token_stats(logits, batch["targets"], batch["mask"])
                return mean_loss(stats), (stats, reported)

            (loss, (stats, reported)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        else:
            loss, stats, grads, reported = _accumulated_grads(model, batch, grad_accum)
        optimizer.update(model, grads)
        metrics = {"loss": loss, "accuracy": stats["correct"] / jnp.maximum(stats["count"], 1.0),
                   "grad_norm": trained_norm(grads, freeze), **diagnostics.scalars(reported)}
        return nnx.state((model, optimizer)), metrics

    return jax.jit(step, donate_argnums=0, out_shardings=(ts.shardings, None))


def _accumulated_grads(model: LanguageModel, batch: dict[str, jax.Array], parts: int):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def micro_grads(carry, micro):
        def loss_sum(params):
            model = nnx.merge(graphdef, params, rest)
            logits, reported = diagnostics.recorded(lambda m: _batch_inputs(m, micro), model)
            stats = token_stats(logits, micro["targets"], micro["mask"])
            return stats["loss_sum"], (stats, reported)

        grads, (stats, reported) = jax.grad(loss_sum, has_aux=True)(params)
        return jax.tree.map(jnp.add, carry, (grads, stats)), reported

    micro = {k: v.reshape(parts, v.shape[0] // parts, *v.shape[1:]) for k, v in batch.items()}
    zeros = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
             {k: jnp.zeros((), jnp.float32) for k in ("loss_sum", "correct", "count")})
    (grads, stats), reported = jax.lax.scan(micro_grads, zeros, micro)
    count = jnp.maximum(stats["count"], 1.0)
    grads = jax.tree.map(lambda g, p: (g / count).astype(p.dtype), grads, params)
    # Diagnostics are logged as their mean over the micro-batches.
    return (stats["loss_sum"] / count, stats, grads,
            jax.tree.map(lambda x: jnp.mean(x, axis=0), reported))


def make_eval_step(ts: TrainState, modes: ModeSchedule | None = None,
                   seed: int = 0) -> Callable:
    """`stats = eval_step(state, batch)`: summed loss / correct / count over scored positions;
    `modes` as in training, drawn at step 0 (the same for every eval)."""

    def eval_step(state: nnx.State, batch: dict[str, jax.Array]):
        model = nnx.merge(ts.graphdef, state)[0]
        batch = with_modes(batch, modes or ModeSchedule(), seed, 0)
        return token_stats(_batch_inputs(model, batch), batch["targets"], batch["mask"])

    return jax.jit(eval_step)


def to_device(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Places this process's slice of a global batch on the mesh (batch over data axes)."""
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)),
                                                      np.asarray(v))
            for k, v in batch.items()}


def check_process_rows(mesh: Mesh, batch_size: int) -> None:
    """Refuses a mesh on which this process's devices do not hold exactly its rows of the
    batch (`process_rows`: rows p·B/P .. (p+1)·B/P − 1), e.g. a tensor or seq axis across
    processes with the batch replicated: each process would feed other rows to one array."""
    count, index = jax.process_count(), jax.process_index()
    if count == 1:
        return
    local = batch_size // count
    rows = set()
    for where in batch_sharding(mesh).addressable_devices_indices_map((batch_size, 1)).values():
        rows.update(range(batch_size)[where[0]])
    if rows != set(range(index * local, (index + 1) * local)):
        raise ValueError(
            f"process {index} of {count}: its devices hold batch rows {sorted(rows)[:8]}..., not "
            f"its own {index * local}..{(index + 1) * local - 1}: the mesh {dict(mesh.shape)} "
            "must split the batch across processes (data/fsdp axes spanning them, the others "
            "within a process)")


def evaluate(ts: TrainState, batches: list[dict[str, np.ndarray]],
             eval_step: Callable | None = None, *, num_words: int | None = None,
             modes: str | None = None) -> dict[str, float]:
    """Mean loss, perplexity and accuracy over the scored positions of `batches`.

    Batches with `target_bytes` (text) add `bits_per_byte`: total nats / (ln 2 · UTF-8 bytes of
    the scored text), comparable across tokenizers. `num_words` (the words of the whole
    evaluated text) adds `word_perplexity`: exp(total nats / words). `modes`: an Oryx eval
    schedule (`hybrid_jax.modes.batch_modes`, e.g. "linear" or "scored=attention,other=linear")
    for every batch, adding `attention_fraction` (of all tokens). Both totals include the loss
    of predicting each document separator (no bytes, no word), as WikiText's word perplexity
    counts its end-of-line token.
    """
    if modes is not None:
        check_reads_modes(ts.model(), "eval modes")
    if batches:  # global batches of the run's size; the mesh may be another's
        check_batch_split(ts.mesh, len(batches[0]["inputs"]))
    eval_step = make_eval_step(ts) if eval_step is None else eval_step
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    num_bytes, in_attention, num_tokens = 0, 0, 0
    with jax.set_mesh(ts.mesh):
        for batch in batches:
            batch = dict(batch)
            if modes is not None:
                batch[f"{EXTRA_PREFIX}{MODE}"] = batch_modes(modes, batch["mask"])
                in_attention += int((batch[f"{EXTRA_PREFIX}{MODE}"] == ATTENTION).sum())
                num_tokens += batch["mask"].size
            target_bytes = batch.pop("target_bytes", None)
            if target_bytes is not None:
                num_bytes += int((target_bytes * batch["mask"]).sum())
            # Every process holds the whole batch and places only its rows: no duplicated work.
            stats = jax.device_get(eval_step(ts.state, to_device(process_rows(batch), ts.mesh)))
            for key in totals:
                totals[key] += float(stats[key])
    if totals["count"] == 0:
        raise ValueError(f"the held-out set of {len(batches)} batches has no scored tokens: "
                         "nothing to evaluate (check data.eval_path and --batches)")
    count = totals["count"]
    loss = totals["loss_sum"] / count
    metrics = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)),
               "accuracy": totals["correct"] / count, "tokens": totals["count"]}
    if num_bytes:
        metrics["bits_per_byte"] = totals["loss_sum"] / (math.log(2) * num_bytes)
        metrics["bytes"] = num_bytes
    if num_words:
        metrics["word_perplexity"] = math.exp(min(totals["loss_sum"] / num_words, 700.0))
    if modes is not None:
        metrics["attention_fraction"] = in_attention / num_tokens
    return metrics


class NonFiniteLossError(FloatingPointError):
    """The loss or the gradient of a step is NaN/inf (`str` says which, and the step)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def bind_data(data: Any, run_dir: Path | None, *, resume: bool = False) -> Any:
    """The data object the pipeline reads: configs that need the run directory (text: its
    tokenizer and token cache) are bound to it; synthetic configs are used as they are."""
    bind = getattr(data, "bind", None)
    return data if bind is None else bind(run_dir, resume=resume)


def held_out_set(data: Any, batch_size: int, num_batches: int, seed: int
                 ) -> tuple[list[dict[str, np.ndarray]], int | None]:
    """Eval batches and, when they cover the whole held-out text, its word count."""
    if hasattr(data, "eval_batches"):
        batches = data.eval_batches(batch_size, num_batches)
        return batches, data.eval_words(batches)
    return eval_batches(data, batch_size=batch_size, num_batches=num_batches, seed=seed), None


def nonfinite_message(step: int, loss: float, grad_norm: float) -> str:
    if not math.isfinite(loss):
        return f"non-finite loss {loss} at step {step} (gradient norm {grad_norm})"
    return f"non-finite gradient (norm {grad_norm}) at step {step}; the loss {loss:.6g} is finite"


def _check_vocab(experiment: ExperimentConfig, data: Any) -> None:
    data_vocab = getattr(data, "vocab_size", None)
    if data_vocab is None or data_vocab <= experiment.model.vocab_size:
        return
    tokenizer = getattr(data, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(f"data.vocab_size={data_vocab} exceeds model.vocab_size="
                         f"{experiment.model.vocab_size}")
    raise ValueError(f"tokenizer {tokenizer.name!r} has {data_vocab} tokens, more than "
                     f"model.vocab_size={experiment.model.vocab_size}: add --set "
                     f"model.vocab_size={data_vocab} (or more)")


class _Run:
    """One training run: state, data iterator, checkpoints and logs, and the loop over steps."""

    def __init__(self, experiment: ExperimentConfig, out: Path | None, progress: bool,
                 resume: bool):
        cfg = self.cfg = experiment.train
        self.experiment, self.out = experiment, out
        # Data next: a missing file or a too-small vocabulary fails before anything compiles.
        self.data = bind_data(experiment.data, out, resume=resume)
        _check_vocab(experiment, self.data)
        self.mesh, self.rules = make_mesh(cfg.mesh), current_rules()
        check_batch_split(self.mesh, cfg.batch_size)
        seq_len = int(getattr(self.data, "seq_len", 0))  # 0: the data does not say
        check_seq_split(self.mesh, seq_len)
        check_process_rows(self.mesh, cfg.batch_size)
        # Rates per device count the mesh's devices, which may be fewer than the host's.
        self.devices = self.mesh.devices.size
        self.local_devices = sum(d.process_index == jax.process_index()
                                 for d in self.mesh.devices.flat)
        # The one trace of the model's initialisation: FLOPs, restore and init start from it.
        self.abstract = _abstract_train_state(experiment, self.mesh)
        check_freeze(cfg.freeze, self.abstract.params,
                     experiment.model.layers if experiment.model.scan_layers else None)
        if cfg.mode_schedule.pattern != "none":
            check_reads_modes(nnx.merge(self.abstract.graphdef, self.abstract.state)[0],
                              "train.mode_schedule")
        self.flops = (step_flops(experiment.model, seq_len, self.abstract.params,
                                 attention_fraction=attention_fraction(cfg.mode_schedule))
                      if seq_len else None)
        if self.flops is not None and self.flops.uncounted:
            log.warning("FLOPs: the sequence work of block types %s is not modelled "
                        "(hybrid_jax.flops): tflops_per_device and mfu_model count their "
                        "matmuls only (mfu, by 6N, is whole)", list(self.flops.uncounted))
        # What start-up opens, closed by `close` (last opened first) or at once when start-up
        # fails part way (a run that never starts must not keep threads and files open).
        self.opened = contextlib.ExitStack()
        try:
            self.batches = DevicePrefetcher(
                train_iterator(self.data, batch_size=cfg.batch_size, seed=cfg.seed),
                self._put, depth=cfg.prefetch)
            self.opened.callback(self.batches.close)
            self.held_out, self.eval_words = held_out_set(self.data, cfg.batch_size,
                                                          cfg.eval_batches, cfg.seed)
            self.step, self.skipped, self.saved_step, self.rollbacks = 0, set(), None, 0
            self.data_changes: list[str] = []
            self.time_limited = False
            self.checkpointer = None if out is None else Checkpointer(
                out, keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoint)
            if self.checkpointer is not None:
                self.opened.callback(self.checkpointer.close)
            damaged: list[dict[str, Any]] = []
            latest = None if self.checkpointer is None else self._latest_intact(damaged)
            if latest is None:
                self.ts = init_train_state(experiment, self.mesh, self.abstract)
            elif self.step > cfg.steps:  # the loop would not run: the setting ignored, recorded
                raise ValueError(f"train.steps={cfg.steps}, but the run's latest checkpoint is "
                                 f"step {self.step}: a resume trains on from there; set "
                                 f"train.steps >= {self.step} (an earlier step: hybrid-jax eval "
                                 "RUN_DIR --step N)")
            self.writes = out is not None and is_main_process()  # logs: process 0 only
            if self.writes:
                # Whole: its presence says the run started (`undo_failed_start`).
                write_atomic(out / "config.json", json.dumps(to_dict(experiment), indent=2))
                if self.step < cfg.steps:  # training on: the results of an earlier end are
                    (out / "results.json").unlink(missing_ok=True)  # not this run's (yet)
            self.step_fn = make_train_step(self.ts, cfg.grad_accum, cfg.mode_schedule, cfg.seed,
                                           cfg.freeze)
            self.eval_step = make_eval_step(self.ts, cfg.mode_schedule, cfg.seed)
            self.schedule = jax.jit(learning_rate_schedule(cfg))  # one compile, not one per op
            self.log = MetricsLog(out if self.writes else None)
            self.opened.callback(self.log.close)
            self.log.truncate(self.step)  # records past the checkpoint are written again
            self.bar = Progress(cfg.steps, initial=self.step, enabled=progress)
            self.opened.callback(self.bar.close)
            self.tokens_per_step = cfg.batch_size * seq_len
            self.model_flops = 0.0  # of the steps since the last log line (flops.py: model count)
            self.peak_flops = cfg.peak_tflops * 1e12 or device_peak_flops()
            self.last_time, self.last_step = time.perf_counter(), self.step
            self.compiled = False  # whether `step_fn` has run (compiled) in this process
            for record in damaged:
                self.log.write(record)
                self.bar.message(f"{record['message']}: moved to {record['moved_to']}")
            if latest is not None:
                self.log.write({"step": self.step, "event": "resumed"})
                self.bar.message(f"resumed from {self.checkpointer.directory / str(self.step)}")
                if self.data_changes:
                    self.log.write({"step": self.step, "event": "data_changed",
                                    "settings": self.data_changes})
                    self.bar.message(f"note: {', '.join(self.data_changes)} changed since the "
                                     "checkpoint; its data position counts batches of the old "
                                     "settings, so some examples may repeat or be skipped")
            elif damaged:
                self.bar.message("no intact checkpoint left: starting from step 0")
        except BaseException:
            self.opened.close()
            raise

    def _put(self, batch: dict[str, np.ndarray]) -> tuple[dict[str, jax.Array], float]:
        """The batch on the mesh, and its training FLOPs by the model count, attention within
        its own documents (counted on the host, in the prefetch thread)."""
        flops = 0.0
        if self.flops is not None:
            tokens = int(np.prod(batch["inputs"].shape))
            flops = self.flops.training_per_token(batch.get("segment_ids")) * tokens
        with use_rules(self.rules):  # the run's table: `use_rules` holds per thread
            return to_device(batch, self.mesh), flops

    def _latest_intact(self, damaged: list[dict[str, Any]]) -> int | None:
        """Restores the latest step that is intact; each damaged later one is moved to
        RUN_DIR/damaged_checkpoints/ (never deleted: a step damaged again, after a rollback
        saved it anew, goes to STEP.1, STEP.2, ...) and recorded in `damaged`."""
        for step in reversed(self.checkpointer.steps()):
            try:
                self.ts = self._restore(step)
                return step
            except DamagedCheckpointError as error:
                folder = self.out / "damaged_checkpoints"
                folder.mkdir(exist_ok=True)
                names = itertools.chain([str(step)], (f"{step}.{i}" for i in itertools.count(1)))
                moved = next(folder / n for n in names if not (folder / n).exists())
                (self.checkpointer.directory / str(step)).rename(moved)
                self.checkpointer.manager.reload()
                damaged.append({"step": step, "event": "damaged_checkpoint",
                                "moved_to": str(moved), "message": str(error)})
        return None

    def _restore(self, step: int | None = None) -> TrainState:
        ts, meta = _restore(self.abstract, self.checkpointer, self.mesh, step)
        check_tokenizer(meta, getattr(self.data, "tokenizer", None),
                        self.checkpointer.directory.parent / TOKENIZER_FILE)
        self.step = self.saved_step = int(meta["step"])
        self.skipped = set(meta.get("skipped_steps", []))
        if "data_state" in meta:  # an imported or converted model has not read data yet
            self.batches.set_state(meta["data_state"])
            self.data_changes = changed_data_settings(meta.get("config"), self.experiment)
        return ts

    def save(self) -> None:
        if self.checkpointer is None or self.saved_step == self.step:
            return
        meta = {"step": self.step, "data_state": self.batches.get_state(),
                "skipped_steps": sorted(self.skipped), "seed": self.cfg.seed,
                "config": to_dict(self.experiment)}
        tokenizer = getattr(self.data, "tokenizer", None)
        if tokenizer is not None:
            meta["tokenizer_sha256"] = tokenizer_fingerprint(tokenizer)
        self.checkpointer.save(self.step, self.ts.state, meta)
        self.saved_step = self.step

    def flush(self, step: int, metrics: dict, flops: float = 0.0) -> None:
        """Checks and logs the metrics of `step` (read one step late: dispatch stays async);
        `flops`: the step's training FLOPs by the model count."""
        self.model_flops += flops
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
            raise NonFiniteLossError(nonfinite_message(step, values["loss"],
                                                       values["grad_norm"]), step)
        cfg = self.cfg
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            seconds = max(now - self.last_time, 1e-9)
            values["tokens_per_s"] = self.tokens_per_step * (step - self.last_step) / seconds
            values["tokens_per_s_per_device"] = values["tokens_per_s"] / self.devices
            if self.flops is not None:
                # mfu: 6N (the MFU of record); tflops_per_device and mfu_model: the model count.
                # The FLOPs of this process's rows, on its own devices.
                values["tflops_per_device"] = (self.model_flops / seconds
                                               / self.local_devices / 1e12)
                if self.peak_flops:
                    values["mfu"] = (self.flops.six_n * values["tokens_per_s_per_device"]
                                     / self.peak_flops)
                    values["mfu_model"] = values["tflops_per_device"] * 1e12 / self.peak_flops
            self.model_flops = 0.0
            values["lr"] = float(self.schedule(step - 1))  # this step's: optax counts from 0
            self.last_time, self.last_step = now, step
            self.log.write({"step": step, **values})
            shown = {"loss": values["loss"], "acc": values["accuracy"],
                     "tok/s": values["tokens_per_s"]}
            for key, name in (("tflops_per_device", "TFLOP/s/dev"), ("mfu", "mfu")):
                if key in values:
                    shown[name] = values[key]
            self.bar.log(step, shown)

    @contextlib.contextmanager
    def paused(self):
        """Time outside the training steps (an eval, a checkpoint save, the train step's
        compile), left out of the next log line's tokens/s and MFU, as the benchmarks count
        them: else every log interval holding an eval read as a throughput dip. The steps
        dispatched before it finish first, so their time stays in."""
        jax.block_until_ready(self.ts.state)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.last_time += time.perf_counter() - start

    def evaluate(self) -> dict[str, float]:
        metrics = evaluate(self.ts, self.held_out, self.eval_step, num_words=self.eval_words)
        self.log.write({"step": self.step, **{f"eval_{k}": v for k, v in metrics.items()}})
        shown = {k: metrics[k] for k in ("loss", "perplexity", "bits_per_byte") if k in metrics}
        self.bar.message(f"eval step {self.step}: " + " ".join(f"{k}={v:.4g}"
                                                                for k, v in shown.items()))
        return metrics

    def rollback(self, error: NonFiniteLossError) -> None:
        """Back to the last checkpoint; the batch of the failed step will be skipped."""
        latest = None if self.checkpointer is None else self.checkpointer.latest_step()
        if latest is None or self.rollbacks >= MAX_ROLLBACKS:
            why = ("no checkpoint to roll back to" if latest is None
                   else f"{MAX_ROLLBACKS} rollbacks already")
            raise NonFiniteLossError(f"{error} ({why})", error.step) from error
        self.rollbacks += 1
        self.checkpointer.wait()
        # Every skip found since that checkpoint stands: its replay hands out the same batches.
        skipped = self.skipped | {error.step}
        self.ts = self._restore()
        self.skipped |= skipped
        self.log.truncate(self.step)
        self.log.write({"step": error.step, "event": "rollback", "to_step": self.step,
                        "message": str(error)})
        self.bar.message(f"{error}: rolled back to step {self.step}, skipping that batch")
        self.bar.set(self.step)
        self.last_time, self.last_step, self.model_flops = time.perf_counter(), self.step, 0.0

    def on_force_exit(self, signal_name: str) -> str:
        """Runs on the watchdog thread before a forced exit: flush, say what is on disk."""
        self.log.flush()
        if self.out is None:
            return "Nothing was saved (no run directory)."
        steps = [] if self.checkpointer is None else saved_steps(self.out)
        saved = (f"the last complete checkpoint is step {max(steps)} "
                 f"({self.checkpointer.directory / str(max(steps))}); resume with --resume"
                 if steps else "no checkpoint was saved")
        return f"{self.out / 'metrics.jsonl'} and tensorboard/ are flushed; {saved}."

    def out_of_time(self, deadline: float | None) -> bool:
        """Whether `train.time_limit_s` has run out (process 0 decides for every process)."""
        if deadline is None:
            return False
        late = time.perf_counter() >= deadline
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            late = bool(multihost_utils.broadcast_one_to_all(np.int32(late)))
        if late:
            self.time_limited = True
            self.log.write({"step": self.step, "event": "time_limit",
                            "seconds": self.cfg.time_limit_s})
            self.bar.message(f"time limit of {self.cfg.time_limit_s:g} s reached at step "
                             f"{self.step} of {self.cfg.steps}")
        return late

    def loop(self, stop: StopSignals) -> None:
        cfg, pending = self.cfg, None
        deadline = time.perf_counter() + cfg.time_limit_s if cfg.time_limit_s else None
        while True:
            try:
                if self.step >= cfg.steps or stop.everywhere() or self.out_of_time(deadline):
                    if stop.received:
                        stop.acknowledge()
                    if pending is not None:
                        self.flush(*pending)
                    return
                batch, flops = next(self.batches)
                if self.step + 1 in self.skipped:
                    # the batch on which this step diverged before
                    batch, flops = next(self.batches)
                # The first call compiles (seconds to minutes): not in the logged rates.
                with contextlib.nullcontext() if self.compiled else self.paused():
                    self.ts.state, metrics = self.step_fn(self.ts.state, batch)
                self.compiled = True
                self.step += 1
                self.bar.update()
                if pending is not None:
                    self.flush(*pending)
                pending = (self.step, metrics, flops)
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.flush(*pending)  # never checkpoint a diverged state
                    pending = None
                    with self.paused():
                        self.save()
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                    with self.paused():
                        self.evaluate()
            except NonFiniteLossError as error:
                if cfg.on_nonfinite != "rollback":
                    raise NonFiniteLossError(
                        f"{error} (--set train.on_nonfinite=rollback restores the last "
                        "checkpoint and skips that batch; a lower train.learning_rate or "
                        "train.grad_clip may avoid it)", error.step) from error
                self.rollback(error)
                pending = None

    def close(self) -> None:
        self.opened.close()


def train(experiment: ExperimentConfig, out_dir: str | Path | None = None, *,
          progress: bool = True, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """Trains `experiment`, evaluates it, and returns the final metrics (also in results.json).

    `resume`: continue from the latest intact checkpoint in `out_dir` (a fresh start if it has
    none). A fresh run refuses a directory holding another run's outputs, or a tokenizer.json
    that its `data.tokenizer` would replace, unless `force` (which removes the outputs).
    Interrupted by SIGTERM / SIGINT, it saves a checkpoint and returns
    `{"interrupted": name, "step": ...}` instead.
    """
    out = None if out_dir is None else Path(out_dir)
    if out is None:
        return _train(experiment, None, progress, resume)
    created = not out.exists()
    make_run_dir(out)
    if not is_main_process():  # process 0 holds the lock and prepares the directory
        return _train(experiment, out, progress, _agreed(resume))
    with RunLock(out):
        resume = prepare_run_dir(out, experiment.name, resume=resume, force=force)
        if isinstance(experiment.data, TextConfig) and not (force or run_outputs(out)):
            check_put_tokenizer(experiment.data, out)  # a fresh start: nothing of a run there
        with undo_failed_start(out, created=created):
            return _train(experiment, out, progress, _agreed(resume))


def _agreed(resume: bool) -> bool:
    """Process 0's decision to resume, on every process (also a barrier: the others start
    once the run directory is prepared)."""
    if jax.process_count() == 1:
        return resume
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(resume)))


def _train(experiment: ExperimentConfig, out: Path | None, progress: bool, resume: bool
           ) -> dict[str, Any]:
    with use_rules(axis_rules(experiment.train.mesh)):
        return _train_with_rules(experiment, out, progress, resume, time.perf_counter())


def _train_with_rules(experiment: ExperimentConfig, out: Path | None, progress: bool,
                      resume: bool, start: float) -> dict[str, Any]:
    runs: list[_Run] = []  # the run, once built: signals during setup are covered too

    def on_force_exit(signal_name: str) -> str:
        return runs[0].on_force_exit(signal_name) if runs else "Nothing was saved yet."

    with StopSignals(experiment.train.stop_grace_s, on_force_exit) as stop:
        run = _Run(experiment, out, progress, resume)
        runs.append(run)
        try:
            with jax.set_mesh(run.mesh):
                run.loop(stop)
                run.save()
                if stop.received:
                    run.log.write({"step": run.step, "event": "interrupted",
                                   "signal": stop.received})
                    return {"experiment": experiment.name, "interrupted": stop.received,
                            "step": run.step, "accuracy": None}
            final = run.evaluate()
        finally:
            run.close()
    results = {"experiment": experiment.name, "steps": run.step,
               "time_limit_reached": run.time_limited,
               "params": count_params(run.ts.model()),
               "train_loss": next((r["loss"] for r in reversed(run.log.history) if "loss" in r),
                                  None),
               **{f"eval_{k}": v for k, v in final.items()},
               "accuracy": final["accuracy"], "wall_time_s": time.perf_counter() - start}
    if run.writes:
        write_results(out, results)
    stop.deliver_late()  # the run is complete and saved; a signal during its end acts now
    return results
