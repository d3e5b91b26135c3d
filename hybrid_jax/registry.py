"""Name → thing registries: one generic `Registry`, and the ones the library keeps.

Every named collection (block types, mixers, model presets, data kinds, experiments, sweeps) is a
`Registry`: `register(name, value, description)` (or the `decorator(name)` form), `get(name)`
raising a `ValueError` that lists the known names, `names()`, `describe(name)`. A registry can
name a `load` hook that imports the modules whose import registers the built-in entries, so
looking a name up never depends on what the caller happened to import first.

This file has no dependencies inside the package, so `config.py` can validate layer specs
against the block registry.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """The suffix ` (did you mean 'x'?)` naming the choice closest to a mistyped `name`, or ""
    when none is close: what an error should say before its long list of names."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry:
    """Named entries of one kind (e.g. "block type"), each with a one-line description."""

    def __init__(self, kind: str, *, load: tuple[str, ...] = ()):
        self.kind = kind
        self._load_modules = load
        self._entries: dict[str, Any] = {}
        self._descriptions: dict[str, str] = {}

    def register(self, name: str, value: Any, description: str = "", *,
                 identity: Callable[[Any], Any] = lambda value: value) -> Any:
        """Adds `value` under `name`. Registering again is a no-op when `identity` of the old and
        new values is the same object (e.g. a module imported twice), else an error."""
        if name in self._entries and identity(self._entries[name]) is not identity(value):
            raise ValueError(f"{self.kind} {name!r} is already registered "
                             f"({identity(self._entries[name])})")
        self._entries[name] = value
        self._descriptions[name] = description or _first_doc_line(value)
        return value

    def decorator(self, name: str, description: str = "") -> Callable[[Any], Any]:
        """`@registry.decorator(name)`: registers the decorated function or class."""
        return lambda value: self.register(name, value, description)

    def _load(self) -> None:
        for module in self._load_modules:
            importlib.import_module(module)

    def get(self, name: str) -> Any:
        self._load()
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}{did_you_mean(name, self.names())}; "
                             f"available {self.kind}s: {self.names()}")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def describe(self, name: str) -> str:
        self.get(name)
        return self._descriptions[name]


def _first_doc_line(value: Any) -> str:
    doc = getattr(value, "description", None) or getattr(value, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


# --- block types and mixers ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockType:
    """A registered block type (a name usable in `ModelConfig.layers`).

    Attributes:
      name: the name used in `ModelConfig.layers`.
      options: a frozen dataclass of the block's options. A field with the same name as a
        `ModelConfig` field defaults to the model's value (e.g. `num_heads`, `window`).
      build: `build(model_config, options, *, layer_index, rngs) -> nnx.Module`.
      description: one line for `hybrid-jax list`.
      defaults: option values this block type sets before the model's and the layer's: a block
        type can be a preset of another's options (e.g. "pha" of the parallel block).
    """

    name: str
    options: type
    build: Callable[..., Any]
    description: str = ""
    defaults: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class MixerType:
    """A registered sequence mixer: its options dataclass and module class
    (`module(model_config, options, *, rngs)`, see `hybrid_jax.nn.blocks.Mixer`)."""

    name: str
    options: type
    module: type
    description: str = ""


BLOCKS = Registry("block type", load=("hybrid_jax.nn",))
MIXERS = Registry("mixer", load=("hybrid_jax.nn",))


def _check_options(kind: str, name: str, options: type) -> None:
    if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
        raise TypeError(f"options of {kind} {name!r} must be a frozen dataclass")


def register_block(name: str, options: type, description: str = "", *,
                   defaults: Mapping[str, Any] | None = None) -> Callable:
    """Decorator registering a block builder under `name` (see `BlockType`)."""

    def decorate(build: Callable) -> Callable:
        _check_options("block type", name, options)
        entry = BlockType(name, options, build, description,
                          tuple(sorted((defaults or {}).items())))
        BLOCKS.register(name, entry, description, identity=lambda e: e.build)
        return build

    return decorate


def register_mixer(name: str, options: type, description: str = "") -> Callable[[type], type]:
    """Class decorator registering a mixer module under `name`; blocks name it in `branches`."""

    def decorate(module: type) -> type:
        _check_options("mixer", name, options)
        MIXERS.register(name, MixerType(name, options, module, description), description,
                        identity=lambda e: e.module)
        return module

    return decorate


def block_type(name: str) -> BlockType:
    return BLOCKS.get(name)


def block_names() -> list[str]:
    return BLOCKS.names()


def mixer_type(name: str) -> MixerType:
    return MIXERS.get(name)


def mixer_names() -> list[str]:
    return MIXERS.names()
