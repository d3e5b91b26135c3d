"""Conversion of a trained transformer into an NHA hybrid (the NHA paper's recipe).

`hybrid-jax convert RUN_DIR --to nha --out NEW_RUN [--window W --slots M --layers I,J]`.
Without `--window`, a layer with a sliding window of its own (Mistral's, Qwen2's) keeps it as
the NHA window, the others get 512; `--window` sets every converted layer's.
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

from collections.abc import Sequence
from pathlib import Path

from hybrid_jax.config import ExperimentConfig, ModelConfig, layer
from hybrid_jax.convert.params import attention_layers, named_values, transplant, write_conversion
from hybrid_jax.nn.lm import LanguageModel

# Attention options an NHA layer takes over unchanged.
SHARED_OPTIONS = ("num_heads", "num_kv_heads", "head_dim", "rope_theta", "rope_fraction",
                  "rope_scaling", "qkv_bias")
NEW_PARAMETER = "mixer/f_proj/kernel"


def nha_config(config: ModelConfig, *, window: int | None, num_slots: int,
               layers: Sequence[int] | None = None, own_windows: bool = False) -> ModelConfig:
    """`config` with attention layers `layers` (default: all) turned into NHA layers of
    `window`; `own_windows`: a layer with a sliding window of its own keeps that one (its
    window branch then sees what the attention saw, and only older tokens reach the slots)."""
    specs = list(config.layers)
    for i in attention_layers(config, layers):
        options = config.block_options(i)
        if options.cosine:
            raise ValueError(f"convert: layer {i} uses cosine attention, which NHA's window "
                             "branch does not compute")
        shared = {name: getattr(options, name) for name in SHARED_OPTIONS}
        own = options.window if own_windows and options.window is not None else window
        specs[i] = layer("nha", **shared, window=own, num_slots=num_slots,
                         value_activation="identity", output_norm=False)
    return config.replace(layers=tuple(specs))


def convert_to_nha(model: LanguageModel, *, window: int | None, num_slots: int,
                   layers: Sequence[int] | None = None, seed: int = 0,
                   own_windows: bool = False) -> LanguageModel:
    """The NHA hybrid of `model` (see the module docstring and `nha_config`); `seed` draws
    the new W_f. A model with stacked layers (`scan_layers`) is converted layer by layer and
    stacked again (its stacked names are not per layer)."""
    scanned, model = model.config.scan_layers, model.with_scan_layers(False)
    config = nha_config(model.config, window=window, num_slots=num_slots, layers=layers,
                        own_windows=own_windows)
    return transplant(config, named_values(model),
                      lambda name, value: value if name.endswith(NEW_PARAMETER) else None,
                      seed=seed).with_scan_layers(scanned)


def convert_run(experiment: ExperimentConfig, model: LanguageModel, source: Path, out: Path,
                *, window: int | None, num_slots: int, layers: Sequence[int] | None = None,
                seed: int = 0, scan_layers: bool = False, own_windows: bool = False
                ) -> tuple[ExperimentConfig, LanguageModel]:
    """Writes the NHA conversion of the run in `source` (its `experiment` and `model`) as the
    run directory `out`, with the source's tokenizer and Hugging Face files; `scan_layers`:
    its layers stacked for `nnx.scan` (fast compiles for fine-tuning)."""
    converted = convert_to_nha(model.with_scan_layers(False), window=window,
                               num_slots=num_slots, layers=layers, seed=seed,
                               own_windows=own_windows).with_scan_layers(scan_layers)
    windows = {"full" if (w := converted.config.block_options(i).window) is None else str(w)
               for i, spec in enumerate(converted.config.layers) if spec.type == "nha"}
    experiment = write_conversion(
        experiment, converted, source, out, suffix="nha",
        description=f"NHA (window {'/'.join(sorted(windows))}, {num_slots} slots)")
    return experiment, converted
