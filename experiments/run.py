"""Runs a named experiment: `python -m experiments.run NAME [--out DIR] [--set key=value ...]`.

Same as `hybrid-jax train NAME ...`. A registered sweep name (e.g.
`expressivity/selective-copying`) runs the whole grid instead: see
`experiments.expressivity.command`.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import registry
from experiments.cli import run_with_logging
from hybrid_jax.config import ExperimentConfig, apply_overrides, from_dict
from hybrid_jax.registry import did_you_mean


def run_experiment(name: str, *, out_dir: str | Path | None = None,
                   overrides: Sequence[str] = (), progress: bool = True,
                   resume: bool = False, force: bool = False) -> dict[str, Any]:
    """Trains experiment `name` (with `key=value` overrides) into `out_dir` (default runs/NAME).

    `resume`: continue the run saved in `out_dir` (its config.json plus `overrides`) from its
    latest checkpoint; a directory without one starts fresh. `force`: overwrite a directory
    that holds another run.
    """
    from hybrid_jax.train import train

    out_dir = Path("runs") / name if out_dir is None else Path(out_dir)
    saved = out_dir / "config.json"
    if resume and saved.is_file() and not force:
        experiment = read_experiment(saved)
        if experiment.name != name:
            raise ValueError(f"{out_dir} holds a run of {experiment.name!r}, not {name!r}: "
                             f"continue it with `hybrid-jax train {experiment.name} --out "
                             f"{out_dir} --resume`, or choose another --out (--force starts "
                             f"{name!r} over there)")
        experiment = _keeping_tokenizer(experiment, apply_overrides(experiment, overrides),
                                        out_dir)
    else:
        experiment = apply_overrides(_registered(name, out_dir), overrides)
    if progress:
        print(f"{name}: {experiment.description}\nrun directory: {out_dir}", flush=True)
    try:
        return train(experiment, out_dir, progress=progress, resume=resume, force=force)
    except FileNotFoundError as e:
        raise _with_data_hint(e) from e


def _registered(name: str, out_dir: Path) -> ExperimentConfig:
    """The registered experiment `name`. An imported or converted model's experiment is no
    registered one, only its run directory's: a start without --resume said "unknown
    experiment", the directory naming it."""
    from hybrid_jax.train.run_dir import recorded_experiment

    if name not in registry.names() and recorded_experiment(out_dir) == name:
        raise ValueError(f"{out_dir} holds a run of {name!r} (an imported or converted model), "
                         f"which only its run directory defines: continue it with `hybrid-jax "
                         f"train {name} --out {out_dir} --resume`")
    return registry.get(name)


def _keeping_tokenizer(saved: ExperimentConfig, experiment: ExperimentConfig, out_dir: Path
                       ) -> ExperimentConfig:
    """`experiment`, unless it names a tokenizer other than `saved`'s while `out_dir` holds
    one: a resume trains with that `tokenizer.json` (its checkpoints were trained with it), so
    the other would be ignored and yet recorded in config.json as the run's."""
    from hybrid_jax.data.text import TOKENIZER_FILE

    before, now = (getattr(e.data, "tokenizer", None) for e in (saved, experiment))
    recorded = out_dir / TOKENIZER_FILE
    if (None in (before, now) or now == before or not recorded.is_file()
            or _same_tokenizer(Path(now), recorded)):
        return experiment
    raise ValueError(f"data.tokenizer={now!r}: a resume keeps the run's own tokenizer "
                     f"({recorded}, from data.tokenizer={before!r}), which its checkpoints were "
                     "trained with; leave data.tokenizer out, or train with it in a new run "
                     "(another --out, or --force)")


def _same_tokenizer(path: Path, recorded: Path) -> bool:
    """Whether `path` is a tokenizer file holding the tokenizer `recorded` holds."""
    from hybrid_jax.data.tokenizer import load_tokenizer, tokenizer_fingerprint

    return path.is_file() and (tokenizer_fingerprint(load_tokenizer(path))
                               == tokenizer_fingerprint(load_tokenizer(recorded)))


def _with_data_hint(error: FileNotFoundError) -> FileNotFoundError:
    """A corpus missing from the shared data folder (the `lm-*` experiments' default paths):
    the error says where that folder is expected and how to point elsewhere."""
    from experiments.configs.lm import DATA, data_origin

    if error.strerror or f"{DATA}{os.sep}" not in str(error):
        return error
    return FileNotFoundError(
        f"{error}: the lm-* experiments read their corpora from {DATA} ({data_origin()}); set "
        "HYBRID_JAX_DATA=DIR for a folder of that layout, or --set data.path=... --set "
        "data.eval_path=... for your own files")


def read_experiment(path: Path) -> ExperimentConfig:
    """The experiment of a run's `config.json`; a damaged file raises a one-line ValueError."""
    try:
        return from_dict(ExperimentConfig, json.loads(path.read_text()))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): restore it or start a new run") \
            from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{path} does not describe an experiment: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.cli import main as cli_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m experiments.run NAME [options]\n\n{__doc__.strip()}\n\n"
              f"sweeps: {', '.join(registry.sweep_names())}\nexperiments: `hybrid-jax list`; "
              "options: `hybrid-jax train --help` (an experiment), `python -m experiments.run "
              "SWEEP --help` (a sweep)", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if _names_a_sweep(argv):
        from experiments.expressivity.command import main as sweep_main

        return sweep_main(argv)
    name = argv[0] if argv else ""
    if name and not name.startswith("-") and name not in registry.names():
        close = difflib.get_close_matches(name, registry.names() + registry.sweep_names(), n=1)
        if "/" in name or (close and close[0] in registry.sweep_names()):
            # a mistyped sweep: the train command's error would list only the experiments
            print(f"python -m experiments.run: error: unknown experiment or sweep {name!r}"
                  f"{did_you_mean(name, registry.sweep_names())}; sweeps: "
                  f"{registry.sweep_names()} (experiments: hybrid-jax list)", file=sys.stderr)
            return 2
    return cli_main(["train", *argv])


def _names_a_sweep(argv: Sequence[str]) -> bool:
    """A sweep's name first, or after options (`--out DIR SWEEP`: the sweep's parser takes
    them in any order; the train command called the sweep an unknown experiment), but not as
    an option's value (`--out expressivity/mqar EXPERIMENT`)."""
    if not argv[0].startswith("-"):
        return argv[0] in registry.sweep_names()
    values = {"--out", "--set", "--jobs"}  # the options that take one
    return any(arg in registry.sweep_names() and before not in values
               for before, arg in itertools.pairwise(argv))


if __name__ == "__main__":
    sys.exit(run_with_logging(main))
