"""Trains every tiny experiment and every tiny preset for two steps, printing `ok NAME` after
each: `python -m tests.reliability.tiny_driver CORPUS_DIR PART PARTS [slow]` trains part PART
of PARTS of the default runs, or of the slow ones (the text experiments read the generated
corpus in CORPUS_DIR). A model that hangs shows as the first name never printed. Experiments
with the same model and data kind compile the same program, so one of them stands for all (its
name lists them). Experiments whose models differ only in the vocabulary size run the same
code on another embedding shape: the first of them is a default run (and the first of each
data kind, so every data kind trains there), the others are slow runs."""

import dataclasses
import math
import sys
from pathlib import Path

from experiments import registry
from hybrid_jax import presets
from hybrid_jax.config import apply_overrides
from hybrid_jax.train.trainer import train
from tests.unrolled_threefry import use_unrolled_threefry

FEW_STEPS = ["train.steps=2", "train.warmup_steps=0", "train.batch_size=4", "train.log_every=1",
             "train.eval_every=0", "train.eval_batches=1", "train.checkpoint_every=0",
             "train.mesh.data=1"]


def tiny_runs(corpus: Path) -> dict:
    """Names → experiment: the tiny experiments, then each tiny preset no experiment trains
    (on the MQAR task of mqar-transformer-tiny)."""
    runs = {}
    for name in registry.names():
        if "tiny" not in name:
            continue
        experiment = apply_overrides(registry.get(name), FEW_STEPS)
        data = type(experiment.data).__name__
        if data == "TextConfig":
            experiment = apply_overrides(experiment, [
                f"data.path={corpus}/train-*.txt", f"data.eval_path={corpus}/valid.txt",
                "data.seq_len=32"])
        elif data == "MQARConfig":
            experiment = apply_overrides(experiment, ["data.seq_len=16",
                                                      "data.num_kv_pairs=2"])
        runs[name] = experiment
    base = runs["mqar-transformer-tiny"]
    for name in presets.names():
        model = presets.get(name)
        if "tiny" in name and all(e.model != model for e in runs.values()):
            runs[f"preset {name}"] = dataclasses.replace(base, model=model)
    same: dict = {}
    for name, experiment in runs.items():
        same.setdefault((experiment.model, type(experiment.data)), []).append(name)
    return {" = ".join(names): runs[names[0]] for names in same.values()}


def split_runs(runs: dict) -> tuple[dict, dict]:
    """`runs` as (default, slow): one run per model up to its vocabulary size, and per data
    kind; the other vocabulary sizes are slow."""
    default, slow, models, kinds = {}, {}, set(), set()
    for name, experiment in runs.items():
        model, kind = experiment.model.replace(vocab_size=1), type(experiment.data)
        fresh = model not in models or kind not in kinds
        (default if fresh else slow)[name] = experiment
        models.add(model)
        kinds.add(kind)
    return default, slow


def part_of(runs: dict, part: int, parts: int) -> dict:
    return dict(list(runs.items())[part::parts])


def main() -> int:
    corpus, part, parts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    runs = split_runs(tiny_runs(corpus))[sys.argv[4:] == ["slow"]]
    use_unrolled_threefry()  # as in the test process (conftest.py): the same bits, cheaper
    for name, experiment in part_of(runs, part, parts).items():
        results = train(experiment, None, progress=False)
        assert math.isfinite(results["train_loss"]), (name, results)
        print(f"ok {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
