"""Checkpoints: restoring onto another mesh, errors that name the file and the mismatch, and
non-finite losses or gradients (stop naming the step, or roll back and skip the batch)."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from hybrid_jax.config import MeshConfig
from hybrid_jax.data.pipeline import train_iterator
from hybrid_jax.flops import step_flops
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train import loss as loss_module
from hybrid_jax.train.checkpoint import CheckpointError, leaf_name, saved_steps
from hybrid_jax.train.metrics import Progress, read_metrics
from hybrid_jax.train.trainer import (
    MAX_ROLLBACKS,
    NonFiniteLossError,
    _Run,
    bind_data,
    restore_train_state,
    train,
)
from tests.data.corpus_helpers import tiny_text_experiment, write_corpus


def with_train(experiment, **changes):
    return dataclasses.replace(experiment, train=dataclasses.replace(experiment.train, **changes))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def run8(corpus, tmp_path_factory):
    """A run saved from an 8-way data-parallel mesh (checkpoints at steps 2 and 4)."""
    experiment = tiny_text_experiment(corpus, steps=4, batch_size=8, checkpoint_every=2,
                                      mesh=MeshConfig(data=8))
    run = tmp_path_factory.mktemp("run8")
    train(experiment, run, progress=False)
    return experiment, run


def test_restore_onto_other_meshes(run8):
    experiment, run = run8
    params = {}
    for mesh_config in (MeshConfig(data=8), MeshConfig(data=2, fsdp=2), MeshConfig(data=1)):
        ts, meta = restore_train_state(with_train(experiment, mesh=mesh_config), run,
                                       make_mesh(mesh_config))
        assert meta["step"] == 4 and meta["data_state"] and meta["config"]["name"] == "text-test"
        model = ts.model()
        params[mesh_config] = jax.device_get(nnx.state(model, nnx.Param))
        table = model.embed.table[...]
        assert len(table.devices()) == mesh_config.data * mesh_config.fsdp
        if mesh_config.fsdp == 2:
            assert table.sharding.spec == P(None, "fsdp")  # [vocab, embed]: embed over fsdp
    saved, *others = params.values()
    for restored in others:
        assert jax.tree.all(jax.tree.map(np.array_equal, restored, saved))


def test_mismatched_checkpoint_names_the_arrays(run8):
    experiment, run = run8
    bigger = dataclasses.replace(experiment, model=experiment.model.replace(vocab_size=300))
    with pytest.raises(CheckpointError) as error:
        restore_train_state(bigger, run, make_mesh(MeshConfig(data=1)))
    message = str(error.value)
    assert f"checkpoint {run.absolute()}/checkpoints/4/state does not match" in message
    assert "(3 arrays differ)" in message  # the table and its two Adam moments
    assert "model/embed/table: checkpoint has (257, 16) float32, the config expects (300, 16) " \
        "float32" in message


@pytest.mark.parametrize("victim, message", [
    ("state/_METADATA", "checkpoint file {}/state/_METADATA is missing or corrupt"),
    ("meta/metadata", "checkpoint file {}/meta/metadata is missing or corrupt"),
    ("state/manifest.ocdbt", "checkpoint {}/state is corrupt or unreadable.*manifest.ocdbt"),
])
def test_corrupt_checkpoint_names_the_file(run8, tmp_path, victim, message):
    """Without checksums (a step killed before they were written), orbax's own reads fail."""
    experiment, run = run8
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    step_dir = copy.absolute() / "checkpoints" / "4"
    (step_dir / "checksums.json").unlink()
    (step_dir / victim).write_text("garbage{")
    with pytest.raises(CheckpointError, match=message.format(step_dir)):
        restore_train_state(experiment, copy, make_mesh(MeshConfig(data=1)))


def test_a_new_run_refuses_a_directory_with_checkpoints(run8):
    experiment, run = run8
    with pytest.raises(ValueError, match="already holds a run of 'text-test' "
                                         r"\(config.json, .*checkpoints.*pass --resume"):
        train(experiment, run, progress=False)


def test_resuming_a_finished_run_saves_nothing_again(run8, tmp_path, monkeypatch):
    """The restored step counts as saved: a run resumed at its last step evaluates and ends
    without saving that step a second time (orbax refuses an existing step). Its progress bar
    (and so its ETA) starts at that step."""
    bars = []

    class Bar(Progress):
        def __init__(self, total, initial=0, **kwargs):
            bars.append((total, initial))
            super().__init__(total, initial, **kwargs)

    monkeypatch.setattr("hybrid_jax.train.trainer.Progress", Bar)
    experiment, run = run8
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    results = train(experiment, copy, progress=False, resume=True)
    assert bars == [(4, 4)]
    first = json.loads((run / "results.json").read_text())
    assert results["steps"] == 4 and results["eval_loss"] == first["eval_loss"]
    assert saved_steps(copy) == [2, 4]
    assert [(r["step"], r["event"]) for r in read_metrics(copy) if "event" in r] == [
        (4, "resumed")]


def test_missing_data_path_is_named(corpus, tmp_path):
    experiment = tiny_text_experiment(corpus)
    experiment = dataclasses.replace(experiment, data=dataclasses.replace(
        experiment.data, eval_path=str(tmp_path / "missing.txt")))
    with pytest.raises(FileNotFoundError, match="data.eval_path: data file .*missing.txt"):
        train(experiment, None, progress=False)


SIGNATURE = 4  # targets that tell a poisoned batch from the others


def poisons_for(experiment, after: int, count: int = 1) -> list[tuple[int, tuple]]:
    """`count` (step, token) pairs, steps after `after` and two apart: the step's batch is the
    only one of the run (and of the `count` after it, used once batches are skipped) whose
    first row starts with the targets `token` (a tuple of SIGNATURE ids)."""
    data = bind_data(experiment.data, None)
    batches = train_iterator(data, batch_size=experiment.train.batch_size,
                             seed=experiment.train.seed)
    firsts = [tuple(next(batches)["targets"][0, :SIGNATURE].tolist())
              for _ in range(experiment.train.steps + count)]
    pairs: list[tuple[int, tuple]] = []
    for step in range(after + 1, experiment.train.steps + 1):
        if firsts.count(firsts[step - 1]) == 1 and (not pairs or step > pairs[-1][0] + 1):
            pairs.append((step, firsts[step - 1]))
            if len(pairs) == count:
                return pairs
    raise AssertionError(f"not {count} batches of {firsts} start with a token of their own")


def poison_for(experiment, after: int) -> tuple[int, tuple]:
    return poisons_for(experiment, after)[0]


@pytest.fixture
def poison(monkeypatch):
    """`poison(*tokens)`: from now on the loss is NaN on a batch whose first row starts with
    one of `tokens` (`poisons_for`); with `gradient=True` the loss stays finite and its
    gradient is NaN (0 · sqrt'(0) = 0 · inf)."""
    token_stats = loss_module.token_stats

    def arm(*tokens: tuple, gradient: bool = False) -> None:
        def poisoned(logits, targets, mask):
            stats = token_stats(logits, targets, mask)
            bad = jnp.any(jnp.all(targets[0, :SIGNATURE] == jnp.asarray(tokens), axis=-1))
            if gradient:
                root = jnp.sqrt(jnp.where(bad, 0.0, 1.0) * (1.0 + 0.0 * logits.sum()))
                return {**stats, "loss_sum": stats["loss_sum"] + 0.0 * root}
            return {**stats, "loss_sum": jnp.where(bad, jnp.nan, stats["loss_sum"])}

        monkeypatch.setattr("hybrid_jax.train.trainer.token_stats", poisoned)

    return arm


def test_non_finite_loss_stops_naming_the_step(corpus, poison):
    experiment = tiny_text_experiment(corpus, steps=12, checkpoint_every=100)
    bad, token = poison_for(experiment, after=0)
    poison(token)
    with pytest.raises(NonFiniteLossError, match=f"^non-finite loss nan at step {bad} "):
        train(experiment, None, progress=False)
    rollback = dataclasses.replace(experiment, train=dataclasses.replace(
        experiment.train, on_nonfinite="rollback"))
    with pytest.raises(NonFiniteLossError, match=r"\(no checkpoint to roll back to\)$"):
        train(rollback, None, progress=False)


def test_non_finite_gradient_of_a_finite_loss_stops_naming_the_step(corpus, poison):
    experiment = tiny_text_experiment(corpus, steps=12, checkpoint_every=100)
    bad, token = poison_for(experiment, after=0)
    poison(token, gradient=True)
    with pytest.raises(NonFiniteLossError, match=rf"^non-finite gradient \(norm nan\) at step "
                                                 rf"{bad}; the loss [0-9.]+ is finite \(--set "
                                                 r"train.on_nonfinite=rollback restores the last "
                                                 r"checkpoint and skips that batch; "):
        train(experiment, None, progress=False)


def test_non_finite_loss_rolls_back_and_skips_the_batch(corpus, poison, tmp_path):
    experiment = tiny_text_experiment(corpus, steps=12, checkpoint_every=2,
                                      on_nonfinite="rollback")
    bad, token = poison_for(experiment, after=2)  # after the first checkpoint
    poison(token)
    run = tmp_path / "runs" / "first"  # a run directory's missing parents are made
    results = train(experiment, run, progress=False)
    records = read_metrics(run)
    rollback = [r for r in records if r.get("event") == "rollback"]
    assert len(rollback) == 1 and rollback[0]["step"] == bad
    assert rollback[0]["to_step"] == (bad - 1) // 2 * 2  # the last checkpoint before it
    assert f"at step {bad}" in rollback[0]["message"]
    train_losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(train_losses) == list(range(1, 13))
    assert all(np.isfinite(v) for v in train_losses.values()) and results["steps"] == 12
    assert results["train_loss"] == train_losses[12] and 0 < results["wall_time_s"] < 600
    # The skip is saved with the checkpoints and read back on resume: a checkpoint saved on an
    # interrupt between the rollback's step and the skipped one must skip that batch too.
    resumed = _Run(experiment, run, progress=False, resume=True)
    try:
        assert (resumed.step, resumed.skipped) == (12, {bad})
    finally:
        resumed.close()


def test_rollbacks_stop_after_max_rollbacks(corpus, poison, tmp_path, monkeypatch):
    """MAX_ROLLBACKS diverging batches are each rolled back and skipped, the first two back to
    the same checkpoint (the second rollback keeps the first one's skip); one more diverging
    batch stops the run naming the limit. The rates after a rollback count the replayed steps
    only (tokens since the step rolled back to, FLOPs of the batch each step ran), and the
    progress bar moves back with the step."""
    bar_steps = []

    class Bar(Progress):
        def set(self, step):
            bar_steps.append(step)
            super().set(step)

    monkeypatch.setattr("hybrid_jax.train.trainer.Progress", Bar)
    experiment = tiny_text_experiment(corpus, steps=12, checkpoint_every=2,
                                      on_nonfinite="rollback")
    pairs = poisons_for(experiment, after=2, count=MAX_ROLLBACKS + 1)
    poison(*[token for _, token in pairs[:MAX_ROLLBACKS]])
    assert train(experiment, tmp_path / "limit", progress=False)["steps"] == 12
    records = read_metrics(tmp_path / "limit")
    events = [(r["step"], r["to_step"]) for r in records if r.get("event") == "rollback"]
    assert [step for step, _ in pairs] == [3, 5, 7, 9]  # batches; each skip shifts the rest
    assert events == [(3, 2), (4, 2), (5, 4)] and bar_steps == [2, 2, 4]
    logged = sorted((r for r in records if "loss" in r), key=lambda r: r["step"])
    assert [r["step"] for r in logged] == list(range(1, 13))
    assert all(r["tokens_per_s"] > 0 for r in logged)
    batches = train_iterator(bind_data(experiment.data, None),
                             batch_size=experiment.train.batch_size, seed=experiment.train.seed)
    ran = [b for i, b in enumerate(next(batches) for _ in range(15)) if i + 1 not in (3, 5, 7)]
    flops = step_flops(experiment.model, experiment.data.seq_len)
    assert [r["tflops_per_device"] * 1e12 / r["tokens_per_s_per_device"] for r in logged] == \
        pytest.approx([flops.training_per_token(b["segment_ids"]) for b in ran[:12]], rel=1e-6)
    poison(*[token for _, token in pairs])
    with pytest.raises(NonFiniteLossError, match=f"\\({MAX_ROLLBACKS} rollbacks already\\)$"):
        train(experiment, tmp_path / "past", progress=False)


def test_leaf_names_say_model_or_optimizer():
    """The names errors and `freeze` patterns use: the state pair's index as its name, nnx's
    trailing `value` dropped."""
    state = ({"blocks": [{"ffn": {"up": {"kernel": {"value": 1}}}}]}, {"mu": {"embed": 2}})
    names = [leaf_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    assert names == ["model/blocks/0/ffn/up/kernel", "optimizer/mu/embed"]
