"""Checkpoints with orbax: the train state (model + optimizer) plus a JSON of run metadata
(step, data-iterator state, skipped batches, config).

Each save is a step directory written under a temporary name and renamed when complete
(orbax's atomic commit), so an interrupted save never looks like a valid checkpoint; leftover
temporary directories are removed when the next run opens the directory. Once a save is
committed, `checksums.json` in its step directory records the size and CRC-32 of every file;
`restore` verifies them first, so flipped bytes or a truncated file raise
`DamagedCheckpointError` naming the file instead of restoring wrong numbers (a step killed
between its commit and its checksums is restored unverified, with a warning, every time: only
the run that saved a step seals it, as a later seal would vouch for whatever happened to its
files in between). Saves are
asynchronous (the arrays are copied to host memory, then written in the background); `keep`
bounds how many stay on disk. Restoring takes an abstract target state with shardings, so a
run can resume on another mesh; a checkpoint whose arrays do not match the target raises
`CheckpointError` naming the directory and each mismatched array.
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from hybrid_jax.files import is_temporary, write_atomic

CHECKSUMS = "checksums.json"

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit the model/optimizer."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose files changed since they were saved, or that cannot be read."""


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


def _file_sums(step_dir: Path) -> dict[str, list[int]]:
    return {str(p.relative_to(step_dir)): [p.stat().st_size, _crc32(p)]
            for p in sorted(step_dir.rglob("*"))
            # Not the checksums' own files: a `.tmp` left by a seal killed before its rename
            # would be listed, and the step read as damaged once it is gone.
            if p.is_file() and p.name != CHECKSUMS and not is_temporary(p, CHECKSUMS)}


def write_checksums(step_dir: Path) -> None:
    """Records size and CRC-32 of every file of a committed step directory."""
    write_atomic(step_dir / CHECKSUMS, json.dumps(_file_sums(step_dir)))


def verify_checksums(step_dir: Path) -> bool:
    """Raises DamagedCheckpointError naming the first file that is missing, truncated or
    changed; returns False when the step has no checksums (saved before they were written)."""
    path = step_dir / CHECKSUMS
    if not path.is_file():
        return False
    try:
        expected = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DamagedCheckpointError(f"checkpoint {step_dir} is damaged: {path.name} is "
                                     f"unreadable ({_first_line(e)})") from e
    for name, (size, crc) in expected.items():
        file = step_dir / name
        if not file.is_file():
            problem = "is missing"
        elif file.stat().st_size != size:
            problem = f"has {file.stat().st_size} bytes, {size} were saved (truncated?)"
        elif _crc32(file) != crc:
            problem = "changed since it was saved (checksum mismatch)"
        else:
            continue
        raise DamagedCheckpointError(f"checkpoint {step_dir} is damaged: {name} {problem}")
    return True


def leaf_name(path: tuple) -> str:
    """`model/blocks/0/mixer/q_proj/kernel` for a key path into a (model, optimizer) state."""
    parts = []
    for key in path:
        name = str(getattr(key, "key", getattr(key, "idx", getattr(key, "name", key))))
        parts.append(name)
    if parts and parts[-1] == "value":
        parts.pop()
    if parts and parts[0] in ("0", "1"):
        parts[0] = ("model", "optimizer")[int(parts[0])]
    return "/".join(parts)


def _describe(leaf: Any) -> str:
    return f"{tuple(leaf.shape)} {jax.numpy.dtype(leaf.dtype).name}"


def saved_steps(run_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoints in `run_dir` (torn saves keep a temporary name)."""
    directory = Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


class Checkpointer:
    """Saves/restores `{"state": pytree, "meta": json}` under `DIR/checkpoints/<step>`."""

    def __init__(self, run_dir: str | Path, *, keep: int | None = 3, async_save: bool = True,
                 read_only: bool = False):
        """`read_only`: for a load (eval, generate, export), which must leave the directory as
        it found it: no `checkpoints/` created (a missing one raises FileNotFoundError) and no
        temporary directories removed (they may be the save a training run is writing)."""
        self.directory = Path(run_dir).absolute() / "checkpoints"
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(f"no checkpoint found in {run_dir}: {self.directory} does "
                                    "not exist")
        self._sealing, self.async_save = threading.Lock(), async_save
        self._unsealed: set[int] = set()  # steps this Checkpointer saved, not yet sealed
        # An async save writes its checksums when orbax has committed it; a synchronous one
        # right after `save` (orbax accepts the callback only for async saves).
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=not read_only, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=not read_only,
            async_options=(ocp.AsyncOptions(post_finalization_callback=self._seal)
                           if async_save else None))
        handlers = {"state": ocp.StandardCheckpointHandler(),
                    "meta": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_handlers=handlers)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        with self._sealing:
            self._unsealed.add(step)
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)),
                          force=True)
        if not self.async_save:  # a synchronous save has no finalization callback
            self._seal()

    def _seal(self) -> None:
        """Writes the checksums of every step this Checkpointer saved whose save has committed
        (process 0 only: the processes of a job share the directory). Another run's unsealed
        step stays unsealed: its files may have changed since that run stopped."""
        if jax.process_index() != 0:
            return
        with self._sealing:
            committed = set(saved_steps(self.directory.parent))
            for step in sorted(self._unsealed & committed):
                step_dir = self.directory / str(step)
                if not (step_dir / CHECKSUMS).is_file():
                    write_checksums(step_dir)
                self._unsealed.discard(step)

    def steps(self) -> list[int]:
        """The committed steps, oldest first."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restores into `target`, a pytree of `jax.ShapeDtypeStruct`s with shardings; returns
        (state, meta, step)."""
        self.manager.reload()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint found in {self.directory}")
        where = self.directory / str(step)
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"checkpoint {where} not found; available steps: "
                                    f"{sorted(self.manager.all_steps())}")
        if not verify_checksums(where):
            log.warning("checkpoint %s has no %s (its run stopped between the save and its "
                        "checksums): restoring it unverified", where, CHECKSUMS)
        meta = self._read_json(where / "meta" / "metadata")
        self._check_matches(where, target, step)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target)))
        except Exception as e:  # orbax/tensorstore raise many types for damaged files
            raise DamagedCheckpointError(f"checkpoint {where / 'state'} is corrupt or unreadable: "
                                  f"{type(e).__name__}: {_first_line(e)}") from e
        return restored["state"], meta, step

    def _read_json(self, path: Path) -> dict[str, Any]:
        try:
            return json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DamagedCheckpointError(f"checkpoint file {path} is missing or corrupt: "
                                  f"{_first_line(e)}") from e

    def _check_matches(self, where: Path, target: Any, step: int) -> None:
        self._read_json(where / "state" / "_METADATA")
        try:
            saved = self.manager.item_metadata(step)["state"].tree
        except Exception as e:  # tensorstore names the damaged file in its message
            raise DamagedCheckpointError(f"checkpoint {where / 'state'} is corrupt or unreadable: "
                                  f"{type(e).__name__}: {_first_line(e)}") from e
        if saved is None:
            raise CheckpointError(f"checkpoint {where / 'state'} has no array metadata")
        found = {leaf_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(saved)[0]}
        wanted = {leaf_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(target)[0]}
        problems = [f"{name}: missing from the checkpoint" for name in wanted
                    if name not in found]
        problems += [f"{name}: in the checkpoint but not in the model/optimizer" for name in found
                     if name not in wanted]
        problems += [f"{name}: checkpoint has {_describe(found[name])}, the config expects "
                     f"{_describe(leaf)}" for name, leaf in wanted.items()
                     if name in found and _describe(found[name]) != _describe(leaf)]
        if problems:
            shown = "; ".join(problems[:6]) + (f"; ... {len(problems) - 6} more"
                                                if len(problems) > 6 else "")
            raise CheckpointError(f"checkpoint {where / 'state'} does not match the experiment "
                                  f"config ({len(problems)} arrays differ): {shown}")

    def wait(self) -> None:
        self.manager.wait_until_finished()
        self._seal()

    def close(self) -> None:
        self.wait()
        self.manager.close()


def _first_line(error: Exception) -> str:
    """The gist of an error: its first line, without tensorstore's long spec dump."""
    text = str(error).strip()
    if not text:
        return ""
    return text.splitlines()[0].split(" [tensorstore_spec=")[0].split(
        " See full TensorStore details")[0]
