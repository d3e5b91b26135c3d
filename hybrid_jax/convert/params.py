"""What the conversions share: a model's parameters by name, and a new model built from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
from flax import nnx

from hybrid_jax.config import ExperimentConfig, ModelConfig
from hybrid_jax.convert.hf import HF_CONFIG, TOKENIZER_FILES
from hybrid_jax.convert.run_dir import write_run
from hybrid_jax.nn.lm import LanguageModel, create_model
from hybrid_jax.train.checkpoint import leaf_name

# What a conversion takes from its source run: the tokenizer and the Hugging Face files. By
# name: any other file there (results an evaluation wrote beside the checkpoints) describes the
# source model, not the converted one.
CARRIED_FILES = (*TOKENIZER_FILES, HF_CONFIG)


def attention_layers(config: ModelConfig, layers: Sequence[int] | None) -> list[int]:
    """The attention layers a conversion turns into another type: `layers`, or all of them if
    None; an empty choice, or a layer that is not attention, is refused by name."""
    attention = [i for i, spec in enumerate(config.layers) if spec.type == "attention"]
    chosen = attention if layers is None else list(layers)
    if not chosen:
        raise ValueError("convert: no layer to convert: "
                         + ("the model has no attention layer (its layers: "
                            f"{[spec.type for spec in config.layers]})" if layers is None
                            else "the chosen layers are empty"))
    for i in chosen:
        if i not in attention:
            raise ValueError(f"convert: layer {i} is not an attention layer; attention layers: "
                             f"{attention}")
    return chosen


def named_values(model: nnx.Module) -> dict[str, jax.Array]:
    """Every variable of `model` by its checkpoint name (`blocks/0/mixer/q_proj/kernel`)."""
    return {leaf_name(path): variable.get_value() for path, variable in
            jax.tree_util.tree_flatten_with_path(nnx.state(model), is_leaf=_is_variable)[0]}


def transplant(config: ModelConfig, values: dict[str, jax.Array],
               new: Callable[[str, jax.Array], jax.Array | None], *, seed: int = 0
               ) -> LanguageModel:
    """A model of `config` whose variables are `values` by name; each other variable is
    `new(name, fresh value)` (its initial value, or another), and None (neither given nor
    new) is an error, as is an entry of `values` the model has no variable for."""
    graphdef, fresh = nnx.split(create_model(config, seed=seed))
    used = set()

    def take(path, variable):
        name = leaf_name(path)
        if name in values:
            used.add(name)
            return variable.replace(values[name].astype(variable.get_value().dtype))
        value = new(name, variable.get_value())
        if value is None:
            raise ValueError(f"convert: {name} is neither in the original model nor a new "
                             "parameter of the conversion")
        return variable.replace(value)

    state = jax.tree_util.tree_map_with_path(take, fresh, is_leaf=_is_variable)
    missing = sorted(set(values) - used)
    if missing:
        raise ValueError(f"convert: parameters of the original model left out: {missing[:4]}")
    return nnx.merge(graphdef, state)


def write_conversion(experiment: ExperimentConfig, converted: LanguageModel, source: Path,
                     out: Path, *, suffix: str, description: str) -> ExperimentConfig:
    """Writes `converted` (of the run in `source`, trained as `experiment`) as the run
    directory `out` with the source's tokenizer and Hugging Face files; its experiment is
    named `<name>-<suffix>`."""
    experiment = dataclasses.replace(
        experiment, name=f"{experiment.name}-{suffix}", model=converted.config,
        description=f"{experiment.name} converted to {description}")
    files = tuple(Path(source) / name for name in CARRIED_FILES
                  if (Path(source) / name).is_file())
    write_run(out, experiment, converted, files=files, source=str(source))
    return experiment


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)
