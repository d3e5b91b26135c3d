"""The Checkpointer on a tiny state: every save sealed with checksums (a synchronous one before
`save` returns), damage found on restore and never sealed over by a later save, unsealed steps
restored with a warning, unreadable array data named, torn saves removed."""

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.train.checkpoint import (
    CHECKSUMS,
    Checkpointer,
    CheckpointError,
    DamagedCheckpointError,
    saved_steps,
)
from tests.train.damage import flip_byte, largest_array_file, truncate

STATE = {"w": jnp.arange(4096.0), "b": jnp.full((3,), 0.5)}
TARGET = {name: jax.ShapeDtypeStruct(a.shape, a.dtype) for name, a in STATE.items()}


def step_dir(run: Path, step: int) -> Path:
    return run.absolute() / "checkpoints" / str(step)


def saved(run: Path, steps=(1,), async_save: bool = True) -> Path:
    checkpointer = Checkpointer(run, async_save=async_save)
    for step in steps:
        checkpointer.save(step, STATE, {"step": step})
    checkpointer.close()
    return run


def restore(run: Path, step: int | None = None):
    checkpointer = Checkpointer(run)
    try:
        return checkpointer.restore(TARGET, step)
    finally:
        checkpointer.close()


def assert_is_state(restored) -> None:
    assert jax.tree.all(jax.tree.map(np.array_equal, restored, STATE))


@pytest.mark.parametrize("async_save", [True, False])
def test_saves_are_checksummed_and_verified(tmp_path, async_save):
    saved(tmp_path, async_save=async_save)
    assert (step_dir(tmp_path, 1) / CHECKSUMS).is_file()
    flip_byte(largest_array_file(step_dir(tmp_path, 1)))
    with pytest.raises(DamagedCheckpointError,
                       match=f"checkpoint {step_dir(tmp_path, 1)} is damaged: "):
        restore(tmp_path)


@pytest.mark.parametrize("damage, problem", [
    (flip_byte, "changed since it was saved"),
    (truncate, r"has \d+ bytes, \d+ were saved \(truncated\?\)"),
    (Path.unlink, "is missing"),
])
def test_damage_is_named_by_the_checksums(tmp_path, damage, problem):
    """Before orbax reads anything: the damaged file and what happened to it."""
    saved(tmp_path, async_save=False)
    damaged = largest_array_file(step_dir(tmp_path, 1))
    damage(damaged)
    name = damaged.relative_to(step_dir(tmp_path, 1))
    with pytest.raises(DamagedCheckpointError, match=f"is damaged: {name} {problem}"):
        restore(tmp_path)


def test_a_synchronous_save_is_sealed_before_it_returns(tmp_path):
    checkpointer = Checkpointer(tmp_path, async_save=False)
    checkpointer.save(1, STATE, {"step": 1})
    assert (step_dir(tmp_path, 1) / CHECKSUMS).is_file()
    checkpointer.close()


@pytest.mark.parametrize("async_save", [True, False])
def test_a_later_save_does_not_seal_over_damage(tmp_path, async_save):
    """Sealing writes checksums only for steps that have none: damage to a sealed step after
    its save stays detectable however many saves follow."""
    checkpointer = Checkpointer(tmp_path, async_save=async_save)
    checkpointer.save(1, STATE, {"step": 1})
    checkpointer.wait()
    flip_byte(largest_array_file(step_dir(tmp_path, 1)))
    checkpointer.save(2, STATE, {"step": 2})
    checkpointer.close()
    with pytest.raises(DamagedCheckpointError, match="checkpoints/1 is damaged: .* changed since"):
        restore(tmp_path, step=1)
    restored, meta, step = restore(tmp_path)
    assert (step, meta) == (2, {"step": 2})
    assert_is_state(restored)


def test_an_unsealed_step_is_restored_with_a_warning(tmp_path, caplog):
    saved(tmp_path, steps=(1, 2))
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.train.checkpoint"):
        assert_is_state(restore(tmp_path, step=1)[0])
    assert not caplog.records  # a sealed step restores silently
    # A seal killed before renaming its checksums into place leaves them under `.tmp`.
    (step_dir(tmp_path, 2) / CHECKSUMS).rename(step_dir(tmp_path, 2) / (CHECKSUMS + ".5eed.tmp"))
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.train.checkpoint"):
        restored, meta, step = restore(tmp_path)
    assert (step, meta) == (2, {"step": 2})
    assert_is_state(restored)
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {step_dir(tmp_path, 2)} has no {CHECKSUMS} (its run stopped between the "
        "save and its checksums): restoring it unverified"]
    # Another run's later save leaves step 2 unsealed: sealed now, the checksums would vouch
    # for files that may have changed since its run stopped (here: a flipped byte).
    flip_byte(largest_array_file(step_dir(tmp_path, 2)))
    saved(tmp_path, steps=(3,))
    assert not (step_dir(tmp_path, 2) / CHECKSUMS).is_file()
    assert (step_dir(tmp_path, 3) / CHECKSUMS).is_file()


def test_unreadable_array_data_of_an_unsealed_step_is_named(tmp_path):
    saved(tmp_path)
    (step_dir(tmp_path, 1) / CHECKSUMS).unlink()
    truncate(largest_array_file(step_dir(tmp_path, 1)))
    with pytest.raises(DamagedCheckpointError,
                       match=f"checkpoint {step_dir(tmp_path, 1)}/state is corrupt or unreadable"):
        restore(tmp_path)
    # Its array metadata gone: the file is named (orbax only found no metadata, a None).
    (step_dir(tmp_path, 1) / "state" / "_METADATA").unlink()
    with pytest.raises(DamagedCheckpointError, match=f"checkpoint file {step_dir(tmp_path, 1)}"
                                                     "/state/_METADATA is missing or corrupt"):
        restore(tmp_path)


def test_a_torn_save_is_removed_by_the_next_run(tmp_path):
    """A save killed before its commit leaves orbax's temporary directory, never a step; the
    next run's Checkpointer removes it (in the background, finished before its first save)."""
    saved(tmp_path)
    torn = tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-1700000000000000"
    (torn / "state").mkdir(parents=True)
    (torn / "state" / "partial").write_bytes(b"\0" * 16)
    checkpointer = Checkpointer(tmp_path)
    assert checkpointer.steps() == [1]
    checkpointer.save(2, STATE, {"step": 2})
    checkpointer.close()
    assert not torn.exists() and saved_steps(tmp_path) == [1, 2]


def test_a_read_only_checkpointer_leaves_the_directory_as_it_found_it(tmp_path):
    """eval/generate/export load read-only: a run without checkpoints/ is named, not given an
    empty one; a temporary directory stays (it may be the save of a training run now)."""
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'checkpoints'} does not exist"):
        Checkpointer(tmp_path, read_only=True)
    assert list(tmp_path.iterdir()) == []
    saved(tmp_path)
    torn = tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-1700000000000000"
    torn.mkdir()
    checkpointer = Checkpointer(tmp_path, read_only=True)
    checkpointer.restore(TARGET)
    checkpointer.close()
    assert torn.is_dir()


def test_a_step_not_saved_is_refused_naming_the_saved_ones(tmp_path):
    saved(tmp_path, steps=(1, 3))
    with pytest.raises(FileNotFoundError, match=r"checkpoints/2 not found; available steps: "
                                                r"\[1, 3\]"):
        restore(tmp_path, step=2)


def test_arrays_of_another_dtype_or_shape_are_refused_and_counted(tmp_path):
    """Same shapes in bfloat16 are not restored as a silent cast: each array is named with
    both descriptions; past six, the message counts the rest."""
    saved(tmp_path)
    checkpointer = Checkpointer(tmp_path)
    bf16 = {name: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16) for name, s in TARGET.items()}
    many = {**bf16, **{f"extra{i}": jax.ShapeDtypeStruct((2,), jnp.float32) for i in range(6)}}
    try:
        with pytest.raises(CheckpointError, match=r"w: checkpoint has \(4096,\) float32, the "
                                                  r"config expects \(4096,\) bfloat16"):
            checkpointer.restore(bf16)
        with pytest.raises(CheckpointError, match=r"\(8 arrays differ\).*; \.\.\. 2 more$"):
            checkpointer.restore(many)
        with pytest.raises(CheckpointError, match=r"\(1 arrays differ\): b: in the checkpoint "
                                                  "but not in the model/optimizer$"):
            checkpointer.restore({"w": TARGET["w"]})
    finally:
        checkpointer.close()
