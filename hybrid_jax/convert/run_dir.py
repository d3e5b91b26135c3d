"""A run directory for a model that did not come from training (an import or a conversion).

It has what a trained run has, so `eval`, `generate` and `train --resume` take it:
`config.json` (the experiment), `checkpoints/0` (the model and a fresh optimizer state, no data
position yet: fine-tuning starts at step 0 on whatever `data.*` says) and `tokenizer.json`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flax import nnx

from hybrid_jax.config import ExperimentConfig, ModelConfig, TrainConfig, to_dict
from hybrid_jax.data.text import TOKENIZER_FILE, TextConfig
from hybrid_jax.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from hybrid_jax.files import write_atomic
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.train.checkpoint import Checkpointer
from hybrid_jax.train.optimizer import make_optimizer
from hybrid_jax.train.run_dir import RunLock, run_outputs, undo_failed_start

# A short fine-tuning schedule at a small learning rate; override with --set train.*.
FINETUNE = TrainConfig(steps=200, batch_size=8, learning_rate=2e-5, warmup_steps=20,
                       min_lr_ratio=0.1, weight_decay=0.0, log_every=10, eval_batches=8)


def pretrained_experiment(name: str, model: ModelConfig, run_dir: Path, *,
                          description: str) -> ExperimentConfig:
    """The experiment of a run directory holding a pretrained model and its tokenizer."""
    data = TextConfig(tokenizer=str((run_dir / TOKENIZER_FILE).absolute()), seq_len=512)
    return ExperimentConfig(name=name, model=model, data=data, train=FINETUNE,
                            description=description)


def write_run(run_dir: str | Path, experiment: ExperimentConfig, model: LanguageModel, *,
              files: tuple[Path, ...] = (), source: str = "") -> Path:
    """Writes `experiment`'s config, a step-0 checkpoint of `model` (recording the fingerprint
    of a `tokenizer.json` among `files`) and copies of `files` into `run_dir`, which must hold
    no run's outputs (checkpoints, metrics, results: they would read as this model's) and no
    process writing there (`RunLock`)."""
    run_dir = Path(run_dir)
    refuse_a_run(run_dir)  # before the lock: a refused call leaves no .lock there
    created = not run_dir.exists()
    activity = f"writing the model of {source}" if source else "writing a model"
    # As a training run holds it: neither writes while the other does.
    with RunLock(run_dir, activity=activity):
        refuse_a_run(run_dir)  # again: another writer may have finished in between
        # A half-written run (a tokenizer, a partial checkpoints/, no config.json) would be
        # refused by the retry as holding a run: a failure removes what this call wrote.
        with undo_failed_start(run_dir, created=created):
            _write(run_dir, experiment, model, files, source)
    return run_dir


def refuse_a_run(run_dir: Path) -> None:
    """Raises ValueError if `run_dir` holds a run's outputs (`write_run` would mix with them)."""
    found = run_outputs(run_dir)
    if found:
        raise ValueError(f"{run_dir} already holds a run ({', '.join(found)}): choose another "
                         "--out")


def _write(run_dir: Path, experiment: ExperimentConfig, model: LanguageModel,
           files: tuple[Path, ...], source: str) -> None:
    for file in files:
        shutil.copyfile(file, run_dir / file.name)
    optimizer = nnx.Optimizer(model, make_optimizer(
        experiment.train, scan_layers=experiment.model.scan_layers), wrt=nnx.Param)
    meta = {"step": 0, "skipped_steps": [], "seed": experiment.train.seed,
            "config": to_dict(experiment), "source": source}
    tokenizer = run_dir / TOKENIZER_FILE
    if tokenizer.is_file():  # as a trained run's checkpoints do: a swapped file is refused
        meta["tokenizer_sha256"] = tokenizer_fingerprint(load_tokenizer(tokenizer))
    checkpointer = Checkpointer(run_dir, keep=None, async_save=False)
    try:
        checkpointer.save(0, nnx.state((model, optimizer)), meta)
    finally:
        checkpointer.close()
    # Last, and whole: its presence says the run is complete (`undo_failed_start`).
    write_atomic(run_dir / "config.json", json.dumps(to_dict(experiment), indent=2))
