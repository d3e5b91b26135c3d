"""Conversion of a trained transformer into an NHA hybrid (the NHA paper's recipe).

`hybrid-jax convert RUN_DIR --to nha --out NEW_RUN [--window W --slots M --layers I,J]`.
Each chosen attention layer becomes an NHA layer that keeps W_q, W_k, W_v, W_o (and q/k/v
biases); the MLPs, norms and embeddings stay. The slot branch reads the pre-RoPE q, k (through
the swish feature map), the window branch the post-RoPE q, k, exactly as in attention. The
converted layers use the attention-compatible options (`value_activation="identity"`,
`output_norm=False`): values and the output projection are the attention's own, so with
W ≥ T (slots empty) the converted model's logits are the original's, in prefill and decode.

New parameters: only the slot gate projection W_f `[D, G, M]` per converted layer, initialised
as in a fresh NHA layer, N(0, init_std²) (ModelConfig.init_std, 0.02 by default): the gates
start near `α = exp(logsigmoid(0)/τ) = 2^(−1/8) ≈ 0.917` per token (τ = 8), and the small random
weights give the M slots different decays, so they do not receive identical updates when
fine-tuning starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
from flax import nnx

from hybrid_jax.config import ExperimentConfig, ModelConfig, layer
from hybrid_jax.convert.run_dir import write_run
from hybrid_jax.nn.lm import LanguageModel, create_model
from hybrid_jax.train.checkpoint import leaf_name

# Attention options an NHA layer takes over unchanged.
SHARED_OPTIONS = ("num_heads", "num_kv_heads", "head_dim", "rope_theta", "rope_fraction",
                  "rope_scaling", "qkv_bias")
NEW_PARAMETER = "mixer/f_proj/kernel"


def nha_config(config: ModelConfig, *, window: int | None, num_slots: int,
               layers: Sequence[int] | None = None) -> ModelConfig:
    """`config` with attention layers `layers` (default: all) turned into NHA layers."""
    attention = [i for i, spec in enumerate(config.layers) if spec.type == "attention"]
    chosen = attention if layers is None else list(layers)
    specs = list(config.layers)
    for i in chosen:
        if i not in attention:
            raise ValueError(f"convert: layer {i} is not an attention layer; attention layers: "
                             f"{attention}")
        options = config.block_options(i)
        if options.cosine:
            raise ValueError(f"convert: layer {i} uses cosine attention, which NHA's window "
                             "branch does not compute")
        shared = {name: getattr(options, name) for name in SHARED_OPTIONS}
        specs[i] = layer("nha", **shared, window=window, num_slots=num_slots,
                         value_activation="identity", output_norm=False)
    return config.replace(layers=tuple(specs))


def convert_to_nha(model: LanguageModel, *, window: int | None, num_slots: int,
                   layers: Sequence[int] | None = None, seed: int = 0) -> LanguageModel:
    """The NHA hybrid of `model` (see the module docstring); `seed` draws the new W_f."""
    config = nha_config(model.config, window=window, num_slots=num_slots, layers=layers)
    old = {leaf_name(path): variable for path, variable in
           jax.tree_util.tree_flatten_with_path(nnx.state(model), is_leaf=_is_variable)[0]}
    graphdef, fresh = nnx.split(create_model(config, seed=seed))
    used = set()

    def take(path, variable):
        name = leaf_name(path)
        if name in old:
            used.add(name)
            return variable.replace(old[name].get_value())
        if not name.endswith(NEW_PARAMETER):
            raise ValueError(f"convert: {name} is neither in the original model nor the new "
                             "slot gate")
        return variable

    state = jax.tree_util.tree_map_with_path(take, fresh, is_leaf=_is_variable)
    missing = sorted(set(old) - used)
    if missing:
        raise ValueError(f"convert: parameters of the original model left out: {missing[:4]}")
    return nnx.merge(graphdef, state)


def convert_run(experiment: ExperimentConfig, model: LanguageModel, source: Path, out: Path,
                *, window: int | None, num_slots: int, layers: Sequence[int] | None = None,
                seed: int = 0, scan_layers: bool = False
                ) -> tuple[ExperimentConfig, LanguageModel]:
    """Writes the NHA conversion of the run in `source` (its `experiment` and `model`) as the
    run directory `out`, with the source's tokenizer and Hugging Face files; `scan_layers`:
    its layers stacked for `nnx.scan` (fast compiles for fine-tuning)."""
    converted = convert_to_nha(model.with_scan_layers(False), window=window,
                               num_slots=num_slots, layers=layers, seed=seed
                               ).with_scan_layers(scan_layers)
    experiment = dataclasses.replace(
        experiment, name=f"{experiment.name}-nha", model=converted.config,
        description=f"{experiment.name} converted to NHA (window {window or 'full'}, "
                    f"{num_slots} slots)")
    files = tuple(p for p in Path(source).iterdir() if p.suffix == ".json"
                  and p.name not in ("config.json", "results.json"))
    write_run(out, experiment, converted, files=files, source=str(source))
    return experiment, converted


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)
