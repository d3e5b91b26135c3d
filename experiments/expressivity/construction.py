"""A hand-set 2-layer hybrid (Mamba-1 → sliding-window attention) that solves selective copying.

The idea of the paper's construction, in this library's blocks (pre-norm residual blocks, no
FFN): the SSM layer keeps "the distance of the most recent number token" in a state that is
reset at every number token and held in between; the attention layer, whose window covers the
largest distance, attends from t to t − d by rotary phase alone and copies that token.

Residual stream (d_model = V + K + 4, V tokens, K distances): a one-hot of the token, a
constant 1, a "no number yet" flag, a one-hot of the latest distance (layer 1 writes it and
clears the flag, so every position has the same norm and RMSNorm scales all alike) and two
"copy" channels (written by layer 2) holding the copied token as a point `(cos φ_v, sin φ_v)`
on a circle, which the untied LM head reads back with the same points (argmax = the token).

Layer 1 (Mamba-1, expand 1, one state per channel, dt rank 1): its short convolution passes
the previous token (the target at t uses the last number strictly before t), so channel i < K
carries `silu(α·[x_{t−1} = number i])`; dt is large after a number token (decay ≈ e^−16: reset,
and write the one-hot of that number) and ≈ 2·10⁻⁹ elsewhere (hold); C reads a constant
channel, so the output is the one-hot of the latest distance. Layer 2 (one head, head size
4, RoPE with base 16): the key is a constant on the rotary pair of frequency θ = 1/4, the query
is that pair rotated by −θd, so the logit is ∝ cos(θ(t − s − d)), largest at s = t − d; its
value is the token's circle point.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.data.tasks import SelectiveCopyingConfig
from hybrid_jax.nn.lm import LanguageModel

ROPE_BASE = 16.0  # head size 4: rotary pairs (0, 2) at frequency 1 and (1, 3) at 16^(−1/2)
THETA = ROPE_BASE ** -0.5
ALPHA = 6.0  # number channels: silu(α) when the token is that number, else silu(0) = 0
DT_GAIN, DT_BIAS = 6.0, -20.0  # dt = softplus(6·silu(6) − 20) ≈ 16 on numbers, e^−20 elsewhere
GATE = 1.0  # z = 1 on every channel: the output gate is silu(1)
LOGIT_SCALE = 4000.0  # (query norm)·(key norm): softmax margin ≈ 4000/2·(1 − cos θ) ≈ 62


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def _silu(x: float) -> float:
    return x / (1 + math.exp(-x))


def solution_config(task: SelectiveCopyingConfig) -> ModelConfig:
    """The 2-layer model: Mamba-1 (N = 1) then attention with window max_distance + 1."""
    V, K = task.vocab_size, task.max_distance - task.min_distance + 1
    return ModelConfig(
        layers=(layer("mamba1", expand=1, state_size=1, dt_rank=1),
                layer("attention", window=task.max_distance + 1)),
        vocab_size=V, d_model=V + K + 4, num_heads=1, head_dim=4, ffn_dim=0,
        rope_theta=ROPE_BASE, tie_embeddings=False)


def selective_copying_solution(task: SelectiveCopyingConfig) -> LanguageModel:
    """A `LanguageModel` whose argmax equals the selective-copying target at every scored
    position, for any sequence length (the task's distances must satisfy θ·max_distance < π).
    """
    if THETA * task.max_distance >= math.pi:
        raise ValueError(f"max_distance={task.max_distance} is too large for the rotary "
                         f"frequency {THETA} (needs θ·max_distance < π)")
    config = solution_config(task)
    V, D = config.vocab_size, config.d_model
    K = task.max_distance - task.min_distance + 1
    distances = np.arange(task.min_distance, task.max_distance + 1)
    token, const, none = np.arange(V), V, V + 1  # residual channels
    latest, copy = V + 2 + np.arange(K), V + 2 + K + np.arange(2)
    numbers = np.array([task.number_token(int(d)) for d in distances])
    phase = 2 * np.pi * np.arange(V) / V  # each token's point on the copy circle

    embed = np.zeros((V, D))
    embed[token, token] = 1.0
    embed[:, const] = embed[:, none] = 1.0
    gain = math.sqrt(D / 3)  # RMSNorm gain of every residual vector (three ones)

    E = D  # Mamba-1 channels (expand 1): 0..K−1 distances, K the constant channel
    x_proj = np.zeros((D, E))
    x_proj[numbers, np.arange(K)] = ALPHA / gain
    x_proj[const, K] = ALPHA / gain
    conv = np.zeros((4, E))
    conv[1] = 1.0  # the previous token only: targets use the last number strictly before t
    s_alpha = _silu(ALPHA)
    dt_low = np.zeros((E, 1))
    dt_low[:K, 0] = 1.0
    b_proj = np.zeros((E, 1))
    b_proj[:K, 0] = 1.0 / s_alpha
    c_proj = np.zeros((E, 1))
    c_proj[K, 0] = 1.0 / s_alpha
    written = _softplus(DT_GAIN * s_alpha + DT_BIAS) * s_alpha  # state after a number token
    out_proj = np.zeros((E, D))
    out_proj[np.arange(K), latest] = 1.0 / (written * _silu(GATE))
    out_proj[np.arange(K), none] = -1.0 / (written * _silu(GATE))
    z_proj = np.zeros((D, E))
    z_proj[const, :] = GATE / gain

    ssm = {"x_proj.kernel": x_proj, "z_proj.kernel": z_proj, "conv.weight": conv,
           "conv.bias": np.zeros(E), "dt_low.kernel": dt_low, "b_proj.kernel": b_proj,
           "c_proj.kernel": c_proj, "dt_proj": np.full((1, E), DT_GAIN),
           "dt_bias": np.full(E, DT_BIAS), "A_log": np.zeros((E, 1)), "D": np.zeros(E),
           "out_proj.kernel": out_proj}

    rho = math.sqrt(LOGIT_SCALE * 2.0)  # the op scales logits by head_size^−1/2 = 1/2
    q = np.zeros((D, 1, 4))
    q[latest, 0, 1] = rho * np.cos(THETA * distances) / gain
    q[latest, 0, 3] = -rho * np.sin(THETA * distances) / gain
    k = np.zeros((D, 1, 4))
    k[const, 0, 1] = rho / gain
    v = np.zeros((D, 1, 4))
    v[token, 0, 0], v[token, 0, 1] = np.cos(phase) / gain, np.sin(phase) / gain
    o = np.zeros((1, 4, D))
    o[0, 0, copy[0]] = o[0, 1, copy[1]] = 1.0
    head = np.zeros((D, V))
    head[copy[0]], head[copy[1]] = np.cos(phase), np.sin(phase)
    attention = {"q_proj.kernel": q, "k_proj.kernel": k, "v_proj.kernel": v,
                 "o_proj.kernel": o}

    params = {"embed.table": embed, "lm_head.kernel": head, "final_norm.scale": np.ones(D),
              "blocks.0.mixer_norm.scale": np.ones(D), "blocks.1.mixer_norm.scale": np.ones(D),
              **{f"blocks.0.mixer.{k}": v for k, v in ssm.items()},
              **{f"blocks.1.mixer.{k}": v for k, v in attention.items()}}
    return _model_with(config, params)


def _model_with(config: ModelConfig, params: dict[str, np.ndarray]) -> LanguageModel:
    """The model of `config` with every parameter given by dotted path (no random init)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: LanguageModel(config,
                                                                        rngs=nnx.Rngs(0))))
    flat = nnx.to_flat_state(abstract)
    names = {".".join(map(str, path)) for path, _ in flat}
    if names != set(params):
        raise ValueError(f"constructed parameters {sorted(set(params) - names)} do not exist; "
                         f"{sorted(names - set(params))} are not set")
    leaves = []
    for path, variable in flat:
        value = params[".".join(map(str, path))]
        if value.shape != variable.shape:
            raise ValueError(f"{path}: constructed shape {value.shape} != parameter shape "
                             f"{variable.shape}")
        leaves.append((path, variable.replace(jnp.asarray(value, variable.get_value().dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def solution_accuracy(task: SelectiveCopyingConfig, *, num_examples: int = 64,
                      seed: int = 0) -> float:
    """Token accuracy of the constructed model on `num_examples` eval sequences of `task`."""
    from hybrid_jax.data.pipeline import eval_batches

    model = selective_copying_solution(task)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, tokens: nnx.merge(graphdef, s)(tokens).argmax(-1))
    correct = total = 0
    for batch in eval_batches(task, batch_size=num_examples, num_batches=1, seed=seed):
        predicted = np.asarray(forward(state, jnp.asarray(batch["inputs"])))
        correct += int(((predicted == batch["targets"]) & batch["mask"]).sum())
        total += int(batch["mask"].sum())
    return correct / total
