"""Conversion of a trained transformer into an Oryx model (linear mode: Mamba-2).

`hybrid-jax convert RUN_DIR --to oryx --out NEW_RUN [--layers I,J]`. Each chosen attention
layer (H query heads, G key/value heads of size D) becomes an Oryx layer in Mamba-2 mode
with H groups of state size N = D and H value heads of P = D (expand = H·D / d_model):

    attention-mode query  attention.q_proj ← W_q
    shared W_K            linear.b_proj    ← W_k   (each key/value head repeated for its H/G
    shared W_V            linear.x_proj    ← W_v    query heads: grouped-query attention
    shared W_O            linear.out_proj  ← W_o    written as multi-head, the same map)

The shared K/V convs start as the identity and have no SiLU, and there is no gated norm
(`conv_activation=False`, `gated_norm=False`), so in attention mode the converted layer is the
original attention exactly (logits equal, in prefill and decode); MLPs, norms and embeddings
stay. Mamba-2, not GDN: the attention's keys enter Mamba-2's recurrence as they are, where
the delta rule needs unit-norm keys, which its attention mode would then see as well.

New parameters (the linear mode), initialised so that it starts as the attention's own
query/key/value read linearly, as Mamba-in-the-Llama initialises its Mamba layers from
attention (Wang et al., 2024): the linear query `c_proj ← W_q` (pre-RoPE) with an identity
C conv; `dt_proj` N(0, init_std²) and `dt_bias`, `A_log`, `D` as in a fresh Mamba-2 layer
(dt log-uniform in [0.001, 0.1], A uniform in [1, 16], D = 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.config import ExperimentConfig, ModelConfig, ModeSchedule, layer
from hybrid_jax.convert.params import attention_layers, named_values, transplant, write_conversion
from hybrid_jax.nn.lm import LanguageModel

# Attention kernels → the Oryx mixer's; REPEATED ones repeat key/value heads for GQA. The
# shared W_K, W_V, W_O (linear.b_proj, x_proj, out_proj) are stored once, under the first of
# their paths in nnx's sorted traversal: the attention mixer's k_proj, v_proj, o_proj.
MOVED = {"q_proj/kernel": ("attention/q_proj/kernel", "linear/c_proj/kernel"),
         "k_proj/kernel": ("attention/k_proj/kernel",),
         "v_proj/kernel": ("attention/v_proj/kernel",),
         "o_proj/kernel": ("attention/o_proj/kernel",)}
REPEATED = ("k_proj/kernel", "v_proj/kernel")
IDENTITY_CONVS = ("linear/x_conv", "linear/b_conv", "linear/c_conv")
NEW = ("linear/dt_proj/kernel", "linear/dt_bias", "linear/A_log", "linear/D")


def oryx_config(config: ModelConfig, layers: Sequence[int] | None = None) -> ModelConfig:
    """`config` with attention layers `layers` (default: all) turned into Oryx layers."""
    specs = list(config.layers)
    for i in attention_layers(config, layers):
        options = config.block_options(i)
        for name, why in (("window", "Oryx's attention mode is full causal attention"),
                          ("cosine", "Oryx's attention mode is softmax attention"),
                          ("qkv_bias", "Oryx's projections have no biases")):
            if getattr(options, name):
                raise ValueError(f"convert: layer {i} has {name}={getattr(options, name)!r}: "
                                 f"{why}")
        heads = options.num_heads
        head_dim = options.head_dim or config.d_model // heads
        if heads * head_dim % config.d_model:
            raise ValueError(f"convert: layer {i}'s heads × head_dim = {heads * head_dim} is "
                             f"not a multiple of d_model={config.d_model} (Mamba-2's expand)")
        specs[i] = layer("oryx", linear_mixer="mamba2", expand=heads * head_dim // config.d_model,
                         ssm_head_dim=head_dim, state_size=head_dim, n_groups=heads,
                         conv_activation=False, gated_norm=False, rope_theta=options.rope_theta,
                         rope_fraction=options.rope_fraction, rope_scaling=options.rope_scaling)
    return config.replace(layers=tuple(specs))


def convert_to_oryx(model: LanguageModel, *, layers: Sequence[int] | None = None,
                    seed: int = 0) -> LanguageModel:
    """The Oryx model of `model` (module docstring); `seed` draws the new dt projection. A
    model with stacked layers (`scan_layers`) is converted layer by layer and stacked again
    (its stacked names are not per layer)."""
    scanned, model = model.config.scan_layers, model.with_scan_layers(False)
    config = oryx_config(model.config, layers)
    values = named_values(model)
    for i, spec in enumerate(config.layers):
        if spec.type != "oryx" or model.config.layers[i].type == "oryx":
            continue
        prefix = f"blocks/{i}/mixer/"
        options = model.config.block_options(i)
        group = options.num_heads // (options.num_kv_heads or options.num_heads)
        for name, targets in MOVED.items():
            kernel = values.pop(prefix + name)
            if name in REPEATED:  # query head h reads key/value head h // group
                kernel = jnp.repeat(kernel, group, axis=1)
            values.update({prefix + target: kernel for target in targets})
    return transplant(config, values, _new_value, seed=seed).with_scan_layers(scanned)


def _new_value(name: str, value: jax.Array) -> jax.Array | None:
    """The initial value of a new linear-mode parameter (identity convs), None if not one."""
    part = name.split("/mixer/", 1)[-1]
    if part.rsplit("/", 1)[0] in IDENTITY_CONVS:
        identity = np.zeros(value.shape)
        if part.endswith("/weight"):
            identity[0] = 1.0  # the current token's tap
        return jnp.asarray(identity, value.dtype)
    return value if part in NEW else None


def convert_run(experiment: ExperimentConfig, model: LanguageModel, source: Path, out: Path,
                *, layers: Sequence[int] | None = None, seed: int = 0,
                scan_layers: bool = False) -> tuple[ExperimentConfig, LanguageModel]:
    """Writes the Oryx conversion of the run in `source` (its `experiment` and `model`) as the
    run directory `out`, with the source's tokenizer and Hugging Face files; `scan_layers`:
    its layers stacked for `nnx.scan`. Its `train.mode_schedule` is `random_chunks` unless the
    source has one: with none, the blocks' default (attention) mode alone would train, and
    `train --resume` would never fit the new linear mode."""
    converted = convert_to_oryx(model.with_scan_layers(False), layers=layers, seed=seed
                                ).with_scan_layers(scan_layers)
    if experiment.train.mode_schedule.pattern == "none":
        experiment = dataclasses.replace(experiment, train=dataclasses.replace(
            experiment.train, mode_schedule=ModeSchedule(pattern="random_chunks")))
    experiment = write_conversion(experiment, converted, source, out, suffix="oryx",
                                  description="Oryx (Mamba-2 linear mode)")
    return experiment, converted
