"""The block registry: block-type names → their options dataclass and module builder.

A model config names its layers by block type (`"attention"`, `"mamba2"`, ...); each block module
registers itself here with `register_block`, so new block types need no change to the config or
model code. This file has no dependencies, so `config.py` can validate layer specs against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class BlockType:
    """A registered block type.

    Attributes:
      name: the name used in `ModelConfig.layers`.
      options: a frozen dataclass of the block's options. A field with the same name as a
        `ModelConfig` field defaults to the model's value (e.g. `num_heads`, `window`).
      build: `build(model_config, options, *, rngs) -> nnx.Module` (the block, residuals included).
      description: one line for `hybrid-jax list`.
    """

    name: str
    options: type
    build: Callable[..., Any]
    description: str = ""


_BLOCKS: dict[str, BlockType] = {}


def register_block(name: str, options: type, description: str = "") -> Callable:
    """Class/function decorator registering a block builder under `name`."""

    def decorate(build: Callable) -> Callable:
        if name in _BLOCKS and _BLOCKS[name].build is not build:
            raise ValueError(f"block type {name!r} is already registered by {_BLOCKS[name].build}")
        if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
            raise TypeError(f"options of block type {name!r} must be a frozen dataclass")
        _BLOCKS[name] = BlockType(name, options, build, description)
        return build

    return decorate


def block_type(name: str) -> BlockType:
    _load_builtin_blocks()
    if name not in _BLOCKS:
        raise ValueError(f"unknown block type {name!r}; registered block types: {block_names()}")
    return _BLOCKS[name]


def block_names() -> list[str]:
    _load_builtin_blocks()
    return sorted(_BLOCKS)


def _load_builtin_blocks() -> None:
    # The built-in blocks register on import of hybrid_jax.nn; importing here (lazily) makes the
    # registry complete even when only hybrid_jax.config was imported.
    import hybrid_jax.nn  # noqa: F401
