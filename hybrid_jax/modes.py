"""Per-token mode schedules of Oryx models (0 = linear, 1 = attention; `nn/oryx.py`).

Training (`train.mode_schedule`, a `config.ModeSchedule`): "random_chunks" cuts each row
into chunks of `chunk` tokens and draws each chunk's mode (attention with probability
`attention_prob`) from `fold_in(key(seed), step)`: reproducible from the step and the same
on every device (the draw runs inside the jitted step on replicated inputs). One draw per row
is shared by all layers.
"attention" / "linear" fix every token's mode (baselines); "none" adds no mode array (the
blocks' `default_mode`).

Inference (`inference_modes`): "linear", "attention", "prefill=linear,decode=attention" (any
mode for each part), or an explicit `[B, T]` array.

Evaluation (`batch_modes`, `hybrid-jax eval --modes`): "linear", "attention", or
"scored=MODE,other=MODE": the positions whose next token is scored (MQAR's queries, the
needle's query) in one mode and the rest in the other, e.g. "scored=attention,other=linear".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.config import ModeSchedule
from hybrid_jax.context import EXTRA_PREFIX
from hybrid_jax.nn.oryx import ATTENTION, LINEAR, MODE, MODE_NAMES, OryxMixer


def check_reads_modes(model: nnx.Module, what: str) -> None:
    """Raises ValueError unless `model` has an Oryx mixer, the only reader of per-token modes:
    given to another model, a schedule would be ignored (`what` names the schedule)."""
    if not any(isinstance(node, OryxMixer) for _, node in nnx.iter_graph(model)):
        types = sorted({spec.type for spec in model.config.layers})
        raise ValueError(f"{what}: a mode schedule drives Oryx layers, and the model has none "
                         f"(its layer types: {types}); leave the schedule out")


def training_modes(schedule: ModeSchedule, shape_BT: tuple[int, int], seed: int,
                   step: jax.Array) -> jax.Array | None:
    """The `[B, T]` int32 modes of a training step's batch, None for pattern "none"."""
    if schedule.pattern == "none":
        return None
    if schedule.pattern != "random_chunks":
        return jnp.full(shape_BT, MODE_NAMES[schedule.pattern], jnp.int32)
    batch, T = shape_BT
    chunks = -(-T // schedule.chunk)
    key = jax.random.fold_in(jax.random.key(seed), step)
    drawn = jax.random.bernoulli(key, schedule.attention_prob, (batch, chunks))
    return jnp.repeat(drawn.astype(jnp.int32), schedule.chunk, axis=1)[:, :T]


def attention_fraction(schedule: ModeSchedule) -> float | None:
    """The expected share of a training batch's tokens in attention mode under `schedule`
    (`flops.step_flops`); None for "none", whose tokens take each block's default mode."""
    if schedule.pattern == "none":
        return None
    if schedule.pattern == "random_chunks":
        return schedule.attention_prob
    return float(MODE_NAMES[schedule.pattern])


def with_modes(batch: dict, schedule: ModeSchedule, seed: int, step: jax.Array) -> dict:
    """`batch` with its modes as the context extra `extra.mode`, unless the pattern is "none";
    a batch that has modes already is refused (they would be replaced silently)."""
    key = f"{EXTRA_PREFIX}{MODE}"
    if schedule.pattern != "none" and key in batch:
        raise ValueError(f"mode schedule {schedule.pattern!r}: the batch has its own modes "
                         f"({key!r}); expected either the batch's modes or a schedule (pattern "
                         f"'none' keeps the batch's)")
    modes = training_modes(schedule, tuple(batch["inputs"].shape), seed, step)
    return batch if modes is None else {**batch, key: modes}


def _parts(schedule: str, names: tuple[str, str]) -> dict[str, int]:
    """"MODE" (both parts) or "A=MODE,B=MODE" for the two part `names` → {part: mode id}."""
    parts = dict.fromkeys(names, schedule)
    if "=" in schedule:
        pairs = [part.partition("=")[::2] for part in schedule.split(",")]
        parts = dict(pairs)
        if set(parts) != set(names) or len(pairs) != len(names):  # a repeat: the last one won
            raise ValueError(f"mode schedule {schedule!r}: expected '{names[0]}=MODE,"
                             f"{names[1]}=MODE'")
    for name, mode in parts.items():
        if mode not in MODE_NAMES:
            raise ValueError(f"mode schedule {schedule!r}: {name} mode {mode!r} is not one of "
                             f"{list(MODE_NAMES)}")
    return {name: MODE_NAMES[mode] for name, mode in parts.items()}


def batch_modes(schedule: str, mask_BT: np.ndarray) -> np.ndarray:
    """`[B, T]` int32 modes of an eval batch whose scored positions are `mask_BT`, from
    "linear", "attention" or "scored=MODE,other=MODE" (module docstring)."""
    parts = _parts(schedule, ("scored", "other"))
    return np.where(np.asarray(mask_BT, bool), parts["scored"], parts["other"]).astype(np.int32)


def inference_modes(schedule, lengths_B, total_len: int) -> np.ndarray:
    """`[B, total_len]` int32 modes of prompts of `lengths_B` tokens and what follows them,
    from a schedule string (module docstring) or an explicit `[B, total_len]` 0/1 array."""
    lengths_B = np.asarray(lengths_B)
    if lengths_B.ndim != 1 or not np.issubdtype(lengths_B.dtype, np.integer) or not (
            (1 <= lengths_B) & (lengths_B <= total_len)).all():
        raise ValueError(f"inference_modes: expected [batch] integer prompt lengths in "
                         f"[1, {total_len}], got {lengths_B.tolist()}")
    batch = lengths_B.shape[0]
    if not isinstance(schedule, str):
        modes = np.asarray(schedule)
        if modes.shape != (batch, total_len) or not np.isin(modes, (LINEAR, ATTENTION)).all():
            raise ValueError(f"mode schedule array: expected [batch, prompt + new tokens] = "
                             f"{[batch, total_len]} of 0/1, got shape {list(modes.shape)} of "
                             f"{np.unique(modes).tolist()}")
        return modes.astype(np.int32)
    parts = _parts(schedule, ("prefill", "decode"))
    in_prompt = np.arange(total_len)[None, :] < lengths_B[:, None]
    return np.where(in_prompt, parts["prefill"], parts["decode"]).astype(np.int32)
