"""What the experiment drivers write: names that keep numbers apart (whole files:
`hybrid_jax.files.write_atomic`), and the check that a run they find finished is this call's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from hybrid_jax.config import ExperimentConfig, as_json


def number_id(value: float) -> str:
    """`value` as a short name that reads back as exactly `value`: `:g` (0.001, 1e-05) where
    that is exact, else `repr`. `:g` alone keeps 6 significant digits, so two learning rates
    differing past them shared one run directory, cell or table column."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def check_same_config(run_dir: Path, experiment: ExperimentConfig, *, marker: str,
                      compare: Sequence[str] | None = None,
                      hint: str = "use another --out") -> ExperimentConfig | None:
    """The experiment of the run in `run_dir` (its config.json) when it equals `experiment` in
    the fields `compare` (default all); None where neither config.json nor `marker` (the file
    a finished run leaves) is there. A finished run of another configuration is refused, else
    its results would be read as this call's; so is a `marker` without the config.json that
    made it, which cannot be checked. `hint` ends the errors: what to do."""
    from experiments.run import read_experiment

    if not (run_dir / "config.json").is_file():
        if (run_dir / marker).exists():
            raise ValueError(f"{run_dir}: holds {marker} but no config.json, so not which "
                             f"configuration made it; expected both: {hint}")
        return None
    saved = read_experiment(run_dir / "config.json")
    names = compare or [f.name for f in dataclasses.fields(ExperimentConfig)]
    differ = [k for k in names if as_json(getattr(saved, k)) != as_json(getattr(experiment, k))]
    if differ:
        raise ValueError(f"{run_dir}: made with another configuration ({differ} differ); "
                         f"expected this call's: {hint}")
    return saved
