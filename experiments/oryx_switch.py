"""Oryx mode-switch curves: per-token loss on held-out text when the mode switches mid-row.

    python -m experiments.oryx_switch RUN_DIR [RUN_DIR ...] [--switch 96,176] [--batches N]
                                      [--baselines RUN_DIR ...] [--out DIR]

For each trained text run (`lm-wikitext2-oryx-gdn-tiny`, mixed-mode training) the held-out
rows are run under three schedules: all attention, all linear, and attention → linear →
attention switching at the `--switch` positions. Writes `OUT/switch.json` (the mean loss at
each position per run and schedule, null at a position no held-out row scores, and segment
means over the scored positions: the first 8 tokens after each switch, the rest of each
segment; null for a segment of none) and `OUT/switch.png` (the curves, smoothed over 8
positions, and below them their difference from all-attention; one column per run, the
switches marked).
`--baselines`: runs of single-mixer models on the same text (`lm-wikitext2-baseline-*`,
`experiments/configs/oryx.py`), whose per-position losses are added to every column (dashed)
and to the segment means, named by their run directories.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from experiments.run import read_experiment
from hybrid_jax.context import TokenContext
from hybrid_jax.files import write_atomic
from hybrid_jax.nn.oryx import ATTENTION, LINEAR, MODE
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import bind_data, held_out_set, restore_train_state

SETTLE = 8  # tokens after a switch reported on their own
SCHEDULES = ("attention", "linear", "switching")
JSON_KEYS = ("switches", "baselines")  # switch.json's own keys, beside one per run


def check_names(runs: list[Path], baselines: list[Path]) -> None:
    """Runs and baselines are named by their directories (checked before any is loaded): a
    second run of one name replaced the first in switch.json and the plot, and a baseline
    named like a schedule (`runs/attention`) replaced the run's own curve of that schedule in
    the segment means."""
    for what, names, taken in (("run directories", [r.name for r in runs], JSON_KEYS),
                               ("--baselines", [b.name for b in baselines], SCHEDULES)):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"{what}: expected distinct directory names, got {repeated} more "
                             f"than once in {names}")
        clashes = [n for n in names if n in taken]
        if clashes:
            raise ValueError(f"{what}: expected names other than {list(taken)}, got {clashes}")


def check_switches(T: int, switches: list[int]) -> None:
    """Switch positions are strictly increasing, each inside the row (1 … T−1): unsorted ones
    undid each other (all-attention rows under the name "switching"), one at or past T made
    a segment of no tokens."""
    if any(b <= a for a, b in itertools.pairwise(switches)):
        raise ValueError(f"--switch: expected strictly increasing positions, got {switches}")
    outside = [s for s in switches if not 0 < s < T]
    if outside:
        raise ValueError(f"--switch: expected positions between 1 and {T - 1} (rows of {T} "
                         f"tokens), got {outside} in {switches}")


def switch_modes(T: int, switches: list[int]) -> np.ndarray:
    """`[T]` modes: attention, then linear from `switches[0]`, attention from `switches[1]` …"""
    check_switches(T, switches)
    modes = np.full(T, ATTENTION, np.int32)
    for i, start in enumerate(switches):
        modes[start:] = LINEAR if i % 2 == 0 else ATTENTION
    return modes


def position_losses(model, batches, modes_T: np.ndarray | None) -> np.ndarray:
    """Mean next-token loss at each position `[T]` over the scored tokens of `batches`, every
    row in the modes `modes_T` (None: no mode array, for models without Oryx layers); NaN at a
    position no row scores (a loss of 0 there read as a perfect prediction, and pulled its
    segment's mean down)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def losses(state, batch):
        ctx = TokenContext.from_batch(batch)
        if modes_T is not None:
            ctx = ctx.replace(extras={MODE: jnp.broadcast_to(modes_T, batch["inputs"].shape)})
        logits = nnx.merge(graphdef, state)(batch["inputs"], ctx).astype(jnp.float32)
        mask = batch["mask"].astype(jnp.float32)
        # An unscored target may be anything (-100 padding): read as 0, since the NaN that
        # gathering outside the vocabulary gives stays NaN times a zero mask (as in loss.py).
        targets = jnp.where(mask > 0, batch["targets"], 0)
        nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
            logits, targets[..., None], -1)[..., 0]
        return jnp.sum(nll * mask, 0), jnp.sum(mask, 0)

    total, count = 0.0, 0.0
    for batch in batches:
        batch = {k: jnp.asarray(v) for k, v in batch.items() if k != "target_bytes"}
        s, c = jax.device_get(losses(state, batch))
        total, count = total + s, count + c
    return np.divide(total, count, out=np.full(np.shape(total), np.nan), where=count > 0)


def _scored_mean(losses: np.ndarray) -> float | None:
    """The mean over the positions that have a loss (not NaN: never scored); None if none."""
    scored = losses[~np.isnan(losses)]
    return float(np.mean(scored)) if scored.size else None


def _json_curve(curve: np.ndarray) -> list[float | None]:
    """A curve for switch.json: null where never scored (NaN is not JSON)."""
    return [None if np.isnan(x) else float(x) for x in curve]


def segments(curves: dict[str, np.ndarray], switches: list[int]) -> list[dict]:
    """Mean loss per schedule over the first SETTLE tokens after each boundary and the rest
    (over the positions scored; None where none is)."""
    T = len(next(iter(curves.values())))
    lengths = {name: len(c) for name, c in curves.items()}
    if len(set(lengths.values())) > 1:  # a baseline of other rows: its positions are not ours
        raise ValueError(f"expected curves of one row length, got {lengths}")
    check_switches(T, switches)
    edges = [0, *switches, T]
    rows = []
    for start, end in zip(edges[:-1], edges[1:], strict=True):
        for lo, hi in ((start, min(start + SETTLE, end)), (min(start + SETTLE, end), end)):
            if hi > lo:
                rows.append({"positions": [lo, hi], **{name: _scored_mean(c[lo:hi])
                                                       for name, c in curves.items()}})
    return rows


def plot(results: dict, switches: list[int], out: Path, baselines: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 5.6), sharey="row",
                             squeeze=False)
    kernel = np.ones(SETTLE) / SETTLE

    def smooth(curve):  # an unscored position (NaN, None in JSON) leaves a gap
        return np.convolve(np.asarray(curve, float), kernel, mode="valid")

    for column, (run, result) in enumerate(results.items()):
        top, bottom = axes[0][column], axes[1][column]
        reference = np.asarray(result["curves"]["attention"], float)
        for name, curve in result["curves"].items():
            x = np.arange(len(curve) - SETTLE + 1) + SETTLE - 1
            top.plot(x, smooth(curve), label=name, lw=1.2)
            bottom.plot(x, smooth(np.asarray(curve, float) - reference), label=name, lw=1.2)
        for name, curve in (baselines or {}).items():
            x = np.arange(len(curve) - SETTLE + 1) + SETTLE - 1
            top.plot(x, smooth(curve), label=name, lw=1, ls="--")
            bottom.plot(x, smooth(np.asarray(curve, float) - reference), label=name, lw=1,
                        ls="--")
        for ax in (top, bottom):
            for s in switches:
                ax.axvline(s, color="grey", ls=":", lw=1)
        top.set_title(run, fontsize=9)
        bottom.set_xlabel("position")
    axes[0][0].set_ylabel(f"loss (nats/byte, mean of {SETTLE})")
    axes[1][0].set_ylabel("minus all-attention loss")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def _model_and_batches(run_dir: Path, num_batches: int) -> tuple:
    """The run's trained model and `num_batches` of its held-out batches."""
    experiment = read_experiment(run_dir / "config.json")
    ts, _ = restore_train_state(experiment, run_dir, make_mesh(experiment.train.mesh))
    data = bind_data(experiment.data, run_dir, resume=True)
    batches, _ = held_out_set(data, experiment.train.batch_size, num_batches,
                              experiment.train.seed)
    return ts.model(), batches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--switch", default="96,176", help="positions where the mode switches")
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--baselines", type=Path, nargs="*", default=[],
                        help="runs of single-mixer models on the same data (no modes)")
    parser.add_argument("--out", type=Path, default=Path("runs/oryx-switch"))
    args = parser.parse_args(argv)
    try:
        switches = [int(x) for x in args.switch.split(",")]
    except ValueError:
        raise ValueError(f"--switch: expected positions separated by commas, got "
                         f"{args.switch!r}") from None
    check_names(args.run_dirs, args.baselines)
    if args.batches < 0:  # no held-out batch at all (0 is the whole held-out set)
        raise ValueError(f"--batches: expected 0 (all) or more, got {args.batches}")
    args.out.mkdir(parents=True, exist_ok=True)
    baselines = {run_dir.name: position_losses(*_model_and_batches(run_dir, args.batches), None)
                 for run_dir in args.baselines}
    results = {}
    for run_dir in args.run_dirs:
        model, batches = _model_and_batches(run_dir, args.batches)
        T = batches[0]["inputs"].shape[1]
        schedules = dict(zip(SCHEDULES, (np.full(T, ATTENTION, np.int32),
                                         np.full(T, LINEAR, np.int32),
                                         switch_modes(T, switches)), strict=True))
        curves = {name: position_losses(model, batches, modes)
                  for name, modes in schedules.items()}
        results[run_dir.name] = {"curves": {k: _json_curve(v) for k, v in curves.items()},
                                 "segments": segments({**curves, **baselines}, switches)}
        print(f"{run_dir.name}: mean loss over [lo, hi) per schedule")
        for row in results[run_dir.name]["segments"]:
            lo, hi = row["positions"]
            print(f"  {f'[{lo}, {hi})':12s} " + "  ".join(
                f"{name} {'–' if row[name] is None else f'{row[name]:.3f}'}"
                for name in [*schedules, *baselines]))
        # After every run: one failing to load or evaluate keeps the runs before it.
        write_atomic(args.out / "switch.json", json.dumps(
            {"switches": switches, **results,
             "baselines": {k: _json_curve(v) for k, v in baselines.items()}}))
    plot(results, switches, args.out / "switch.png", baselines)
    print(f"wrote {args.out / 'switch.json'} and {args.out / 'switch.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
