"""Checkpoints with orbax: the train state (model + optimizer) plus a JSON of run metadata.

Each save is a step directory written through a temporary name and renamed when complete
(orbax's atomic commit), so an interrupted save never looks like a valid checkpoint.
Restoring takes an abstract target state with shardings, so a run can resume on another mesh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp


class Checkpointer:
    """Saves/restores `{"state": pytree, "meta": json}` under `DIR/checkpoints/<step>`."""

    def __init__(self, run_dir: Path, *, max_to_keep: int | None = 3, async_save: bool = True):
        self.directory = Path(run_dir).absolute() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)),
                          force=True)

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restores into `target`, a pytree of `jax.ShapeDtypeStruct`s with shardings; returns
        (state, meta, step)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint found in {self.directory}")
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return restored["state"], restored["meta"], step

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
