"""The READMEs' code runs as written: the tour's Python executes (and its decode prefill equals
the parallel forward), and every documented `hybrid-jax ...` and `python -m experiments....`
line parses (with the CLI, a sweep's parser or the module's own), names a registered
experiment or sweep, and its `--set` overrides apply to that experiment's config; in the
prose, the flags of `hybrid-jax` synopses, the config paths (`train.steps`) and the files and
links named exist. A renamed flag, preset, config field or file fails here instead of in a
user's terminal."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from experiments import registry
from experiments.cli import build_parser
from experiments.expressivity.command import build_parser as build_sweep_parser
from hybrid_jax.config import ExperimentConfig, ModelConfig, apply_overrides
from hybrid_jax.convert.run_dir import pretrained_experiment
from hybrid_jax.registry import block_names, block_type
from tests.helpers import parsed_by_main

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "experiments/README.md")
# The placeholder experiment of generic lines ("hybrid-jax train NAME --set data.tokenizer=...").
PLACEHOLDER_NAME = "lm-wikitext2-transformer-tiny"
COMMAND = re.compile(r"(hybrid-jax|python3? -m experiments\.[\w.]+) ")
# Variables a documented block may use without setting them: the device tool's output folder.
EXTERNAL = {"OUT": "out"}
FOR_LOOP = re.compile(r"for (\w+) in ([^;]+); do$")
ASSIGNMENT = re.compile(r"(\w+)=(.*)$")


def code_blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of each fenced block."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current = (line[3:].strip(), number + 1, [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[2].append(line)
    assert current is None, f"{path}: a code block opened at line {current[1] - 1} never closes"
    return blocks


def shell_commands(lines: list[str], first: int) -> list[tuple[int, str]]:
    """(line number, command) of the documented commands in one shell block: continuations
    joined, shell variables set in the block substituted, and a line inside `for` loops once
    per loop value."""
    variables = dict(EXTERNAL)
    loops: dict[str, list[str]] = {}
    logical: list[tuple[int, str]] = []
    for offset, line in enumerate(lines):
        if logical and logical[-1][1].endswith("\\"):
            logical[-1] = (logical[-1][0], logical[-1][1][:-1].rstrip() + " " + line.strip())
        else:
            logical.append((first + offset, line.strip()))
    commands = []
    for number, line in logical:
        if match := FOR_LOOP.match(line):
            loops[match[1]] = match[2].split()
        elif line == "done":
            loops.popitem()
        elif (match := ASSIGNMENT.match(line)) and not COMMAND.match(line):
            variables[match[1]] = _substitute(shlex.split(match[2])[0], variables)
        elif COMMAND.match(line) and " ..." not in line:
            for values in itertools.product(*loops.values()):
                bound = variables | dict(zip(loops, values, strict=True))
                commands.append((number, _substitute(line, bound)))
    return commands


def _substitute(text: str, variables: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        assert match[1] in variables, f"${match[1]} is not set in its block: {text}"
        return variables[match[1]]
    return re.sub(r"\$(\w+)", value, text)


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for name in DOCUMENTS:
        for language, first, lines in code_blocks(ROOT / name):
            if language in ("", "bash", "sh"):
                found += [(f"{name}:{number}", command)
                          for number, command in shell_commands(lines, first)]
    return found


COMMANDS = documented_commands()


def prose_spans(name: str) -> list[str]:
    """The inline code spans of a document, outside its fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", (ROOT / name).read_text(), flags=re.S | re.M)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]*)`", prose)]


def inline_commands() -> list[tuple[str, str]]:
    """(document, text) of the `hybrid-jax ...` spans in the prose: synopses with
    placeholders and optional groups, so only their flags are checked."""
    return [(name, span) for name in DOCUMENTS for span in prose_spans(name)
            if span.startswith("hybrid-jax ")]


INLINE = inline_commands()
# Spans that look like config paths and are not: methods and Hugging Face file names.
NOT_CONFIG = {"model.decode", "model.init_cache", "model.safetensors",
              "model.safetensors.index.json"}


def config_mentions() -> list[tuple[str, str]]:
    """(document, `section.field[.field]`) of each config path the prose names (`train.steps`,
    `--set data.seq_len=128`, ...)."""
    return [(name, path) for name in DOCUMENTS for span in prose_spans(name)
            for path in re.findall(r"(?:^|--set '?|\s)((?:model|train|data|family)\.[\w.]+)", span)
            if path not in NOT_CONFIG]


MENTIONS = config_mentions()


# Repository paths in the prose: from the root, or (nn/, ops/, ...) from hybrid_jax/.
TOP_DIRS = (".ci/", "colab/", "experiments/", "hybrid_jax/", "pallas_kernels/", "tests/")
PACKAGE_DIRS = ("convert/", "data/", "nn/", "ops/", "train/")


def named_paths() -> list[tuple[str, str]]:
    """(document, path) of each repository path in the prose of the READMEs (code spans) and
    of each relative Markdown link."""
    found = []
    for name in (*DOCUMENTS, "colab/README.md"):
        for span in prose_spans(name):
            found += [(name, token.rstrip(".,:;")) for token in re.findall(r"[\w./*-]+", span)
                      if token.startswith(TOP_DIRS + PACKAGE_DIRS)]
        links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", (ROOT / name).read_text())
        found += [(name, str(Path(name).parent / link)) for link in links
                  if not link.startswith(("http:", "https:"))]
    return found


PATHS = named_paths()


def argv_of(command: str) -> tuple[str, list[str]]:
    """The parser (`cli`: hybrid-jax's, `sweep`: a sweep's, else the module whose `main` parses)
    and its arguments: optional `[--flag ...]` groups taken, NAME replaced by a registered
    experiment."""
    command = re.sub(r"(^|\s)\[(--[^\]]*)\]", r"\1\2", command)
    words = shlex.split(command, comments=True)
    program, args = ("cli", words[1:]) if words[0] == "hybrid-jax" else (words[2], words[3:])
    if program == "experiments.cli":
        program = "cli"
    elif program == "experiments.run":  # `hybrid-jax train X`, or a sweep
        program, args = ("sweep", args) if args[0] in registry.sweep_names() \
            else ("cli", ["train", *args])
    return program, [PLACEHOLDER_NAME if a == "NAME" else a for a in args]


def test_the_documents_hold_the_commands_this_test_checks():
    assert len(COMMANDS) >= 50 and len(INLINE) >= 10 and len(MENTIONS) >= 40
    lines = {command.split()[1] for _, command in COMMANDS if command.startswith("hybrid-jax")}
    assert {"train", "eval", "generate", "import", "export", "convert", "tokenizer", "plot",
            "inspect", "list"} <= lines


def test_optional_groups_loops_and_variables_expand():
    lines = ["W=/data", 'D="--set data.path=$W/a.txt"', "for B in gdn mamba2; do",
             "  hybrid-jax train x-$B $D \\", "      --out runs/$B [--set train.steps=2]",
             "done", "hybrid-jax list  # comment"]
    assert shell_commands(lines, 10) == [
        (13, "hybrid-jax train x-gdn --set data.path=/data/a.txt --out runs/gdn "
             "[--set train.steps=2]"),
        (13, "hybrid-jax train x-mamba2 --set data.path=/data/a.txt --out runs/mamba2 "
             "[--set train.steps=2]"),
        (16, "hybrid-jax list  # comment")]
    assert argv_of(shell_commands(lines, 10)[0][1]) == ("cli", [
        "train", "x-gdn", "--set", "data.path=/data/a.txt", "--out", "runs/gdn", "--set",
        "train.steps=2"])
    assert argv_of("python -m experiments.run NAME --set 'seeds=[0,1]'") == (
        "cli", ["train", PLACEHOLDER_NAME, "--set", "seeds=[0,1]"])
    with pytest.raises(AssertionError, match=r"\$X is not set"):
        shell_commands(["hybrid-jax train $X"], 1)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses_and_its_overrides_apply(where, command):
    program, argv = argv_of(command)
    try:
        if program not in ("cli", "sweep"):
            parsed_by_main(program, argv)
            return
        args = (build_sweep_parser() if program == "sweep" else build_parser()).parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: the CLI refuses `{command}`")
    if program == "sweep":
        apply_overrides(registry.get_sweep(args.name), args.overrides)
    elif args.command == "train":
        apply_overrides(experiment_of(args, where), args.overrides)


def experiment_of(args, where: str) -> ExperimentConfig:
    """The registered experiment `args.name`, or for `--resume` of an imported model's run
    directory (`hf-<model_type>`, `-nha` / `-oryx` after a conversion) the one `import hf`
    writes."""
    if args.name in registry.names():
        return registry.get(args.name)
    assert args.resume and args.name.startswith("hf-"), f"{where}: no experiment {args.name!r}"
    return pretrained_experiment(args.name, ModelConfig(), args.out, description="")


@pytest.mark.parametrize("where,span", INLINE, ids=[f"{w}:{s[:40]}" for w, s in INLINE])
def test_inline_command_flags_exist(where, span):
    subcommands = next(action for action in build_parser()._actions
                       if isinstance(action, argparse._SubParsersAction)).choices
    command = span.split()[1]
    assert command in subcommands, f"{where}: no subcommand {command!r} in `{span}`"
    flags = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", span))
    unknown = flags - set(subcommands[command]._option_string_actions)
    assert not unknown, f"{where}: `{span}` names flags {command} does not take: {unknown}"


@pytest.mark.parametrize("where,path", MENTIONS, ids=[f"{w}:{p}" for w, p in MENTIONS])
def test_config_paths_in_the_prose_exist(where, path):
    """A field named in the prose exists: `model.*` / `train.*` on every experiment, `data.*`
    on one of the data configs, `family.*` on a sweep's model family."""
    section, *fields = path.rstrip(".").split(".")  # `train.mesh.*`: the section itself
    if section == "family":
        roots = [registry.get_sweep(name).family for name in registry.sweep_names()]
    else:
        roots = [getattr(registry.get(name), section) for name in registry.names()]
    if section == "model" and len(fields) == 1:  # a block option set on every layer having it
        roots += [block_type(name).options for name in block_names()]

    def has(config, fields) -> bool:
        return not fields or (dataclasses.is_dataclass(config) and fields[0] in {
            f.name for f in dataclasses.fields(config)} and has(getattr(config, fields[0], None),
                                                              fields[1:]))
    assert any(has(root, fields) for root in roots), f"{where}: no config field {path}"


def test_paths_in_the_prose_exist():
    missing = [(where, path) for where, path in PATHS
               if not any(list(ROOT.glob(candidate)) for candidate in (
                   [path, f"hybrid_jax/{path}"] if path.startswith(PACKAGE_DIRS) else [path]))]
    assert len(PATHS) >= 100 and not missing, missing


def test_a_bad_documented_override_would_fail():
    """The check above can fail: an unknown field or a bad value raises."""
    with pytest.raises(ValueError):
        apply_overrides(registry.get(PLACEHOLDER_NAME), ["train.no_such_field=1"])
    with pytest.raises(ValueError):
        apply_overrides(registry.get(PLACEHOLDER_NAME), ["train.steps=many"])


def test_the_tour_runs_and_its_prefill_equals_the_forward():
    (tour,) = [lines for language, _, lines in code_blocks(ROOT / "README.md")
               if language == "python"]
    namespace: dict = {}
    exec(compile("\n".join(tour), "README.md (tour)", "exec"), namespace)
    model, tokens_BT = namespace["model"], namespace["tokens_BT"]
    np.testing.assert_allclose(namespace["logits_BTV"], model(tokens_BT), rtol=1e-4, atol=1e-4)
    assert namespace["logits_B1V"].shape == (2, 1, model.config.vocab_size)
    assert np.isfinite(namespace["logits_B1V"]).all()
