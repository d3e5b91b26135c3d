"""FLOPs of a training step, written once for the throughput benchmark and the trainer's MFU.

Per token of a length-T sequence, forward:
  matmuls      2·N, N the parameters of every weight matrix (the projections, FFNs and the LM
               head; the embedding lookup is no matmul, a tied embedding counts once as head)
  attention    2·(q/k width + value width) per (query, key) pair, summed over heads (4·D per
               head of D): causal attention counted half (a query at in-document position p
               sees p+1 keys), a window w by its band (min(p+1, w) keys). Without segment ids
               a row is one document (p = t); with them each packed document is its own
               triangle, as the kernels skip the pairs across documents.
  recurrences  the work of their chunked form (chunk C): intra-chunk C×C products, the state
               reads and writes (e.g. Mamba-2: 2C(N + P) + 4NP per head)
               (GSS's DSS: 2CH Toeplitz + 8HN state work, H channels, N complex modes)
  Oryx         its linear mixer's recurrence (as "gdn" / "mamba2") on every token, and attention
               on its attention-mode rows: that mixer's heads (GDN: H of K, values V; Mamba-2:
               G of N, values the whole inner width H·P), weighted by `attention_fraction`,
               the expected share of tokens in attention mode (`modes.attention_fraction` of
               the training schedule; None: each layer's `default_mode`). A schedule of only
               one mode skips the other mixer (nn/oryx.py "Cost"): fraction 1 counts no
               recurrence, 0 no attention.
Training multiplies everything by 3 (backward = 2 × forward). Composite blocks ("sequential",
"parallel", "pha") count the sum of their branches. Mixers without a sequence term here
(Mamba-1) count their matmuls only; `uncounted` lists them: the trainer warns of them (its
`tflops_per_device` / `mfu_model` leave their sequence work out; `mfu`, by 6N, is whole), the
benchmarks print them (train_throughput's and scale's `uncounted` columns).

Two counts, and where each is printed:
  6N          `StepFlops.six_n` = 3 × matmul per token: the issue's target count, the same
              for packed and unpacked rows. The MFU of record: the trainer's `mfu`, the
              throughput benchmark's `mfu_6n` / `mfu_6n_matmul` columns.
  model       `StepFlops.training_per_token(segment_ids)`: 6N + attention (within documents
              when the ids are given) + recurrences. The trainer's `tflops_per_device` and
              `mfu_model` (from each batch's own segment ids), the benchmark's `tflops` and
              `mfu_model*` columns.

MFU = achieved FLOP/s per device / peak. `device_peak_flops` knows the dense bf16 peaks of the
usual accelerators (None for others: then the trainer logs no MFU unless given a peak).
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from hybrid_jax.config import ModelConfig, check_finite
from hybrid_jax.nn.lm import layer_ndim
from hybrid_jax.ops.checks import check_count

# Dense bf16 peaks (FLOP/s) by a whole-word part of device_kind, most specific first (the
# PCIe H100 runs at lower clocks than the SXM one; "L4" is not the L40S).
PEAK_BF16 = (("H100 PCIe", 756e12), ("H200", 989e12), ("H100", 989e12), ("GH200", 989e12),
             ("A100", 312e12), ("L4", 121e12), ("TPU v6", 918e12), ("TPU v5p", 459e12),
             ("TPU v5", 197e12), ("TPU v4", 275e12))


def device_peak_flops(device_kind: str | None = None) -> float | None:
    """Dense bf16 FLOP/s of a device kind (default: the first device's), None if unknown."""
    kind = jax.devices()[0].device_kind if device_kind is None else device_kind
    return next((peak for name, peak in PEAK_BF16
                 if re.search(rf"\b{re.escape(name)}\b", kind, re.IGNORECASE)), None)


class AttentionTerm(NamedTuple):
    """One attention term of a model: FLOPs per visible (query, key) pair (4·D·H for H heads of
    D), the layer's window, and the fraction of query rows computed (Oryx: its attention-mode
    tokens)."""

    pair: float
    window: int | None
    rows: float = 1.0


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """Forward FLOPs per token, by kind, of sequences of `length` tokens.

    `attention_terms`: one `AttentionTerm` per attention term of the model; `attention` is
    their dense-row count.
    """

    matmul: float
    attention_terms: tuple[AttentionTerm, ...]
    recurrence: float
    length: int
    uncounted: tuple[str, ...] = ()

    @property
    def six_n(self) -> float:
        """6·N training FLOPs per token (N: the matmul parameters): the target's count."""
        return 3.0 * self.matmul

    def attention_per_token(self, segment_ids_BT: np.ndarray | None = None) -> float:
        """Forward attention FLOPs per token; with `[B, T]` segment ids, within documents."""
        pairs_by_window: dict[int | None, float] = {}
        for pair, window, rows in self.attention_terms:
            pairs_by_window[window] = pairs_by_window.get(window, 0.0) + pair * rows
        keys = ((lambda w: mean_keys(self.length, w)) if segment_ids_BT is None else
                (lambda w: mean_document_keys(segment_ids_BT, w)))
        return sum(pair * keys(window) for window, pair in pairs_by_window.items())

    @property
    def attention(self) -> float:
        return self.attention_per_token()

    def training_per_token(self, segment_ids_BT: np.ndarray | None = None) -> float:
        """3 × (matmul + attention + recurrence): the model count (module docstring)."""
        return 3.0 * (self.matmul + self.attention_per_token(segment_ids_BT) + self.recurrence)


def matmul_params(config: ModelConfig, params: nnx.State | None = None) -> int:
    """Parameters of the weight matrices a token multiplies (module docstring). `params`: the
    model's `nnx.Param` state (shapes suffice), built abstractly from `config` if not given."""
    if params is None:
        from hybrid_jax.nn.lm import LanguageModel  # nn builds the model; flops reads shapes

        params = nnx.state(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))),
                           nnx.Param)
    total = config.d_model * config.vocab_size if config.tie_embeddings else 0
    for path, leaf in nnx.to_flat_state(params):
        names = [str(p) for p in path]
        if (layer_ndim(names[0], len(leaf.shape), config.scan_layers) < 2
                or names[0] in ("embed", "position_table")):
            continue
        if any("conv" in n for n in names):
            continue
        total += int(np.prod(leaf.shape))
    return total


def mean_keys(length: int, window: int | None) -> float:
    """Mean number of keys a causal query sees over t = 0..T−1 (window w: min(t+1, w))."""
    if window is None or window >= length:
        return (length + 1) / 2
    return (window * (window + 1) / 2 + (length - window) * window) / length


def mean_document_keys(segment_ids_BT: np.ndarray, window: int | None) -> float:
    """Mean number of keys a causal query sees within its document (window w: at most w), over
    the tokens of `[B, T]` segment ids (host numpy). A document is a run of equal ids; an id
    that comes back later starts another (the packers never do that)."""
    ids = np.asarray(segment_ids_BT)
    index = np.arange(ids.shape[1])
    starts = np.concatenate([np.ones((ids.shape[0], 1), bool), ids[:, 1:] != ids[:, :-1]], 1)
    position = index - np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    keys = position + 1 if window is None else np.minimum(position + 1, window)
    return float(keys.mean())


def _head_dim(config: ModelConfig, options, heads: int) -> int:
    return options.head_dim or config.head_dim or config.d_model // heads


def _pair_flops(query_key_width: int, value_width: int) -> float:
    """FLOPs of one visible (query, key) pair, widths summed over the heads: q·k and p·v, a
    multiply-add (2 FLOPs) per channel (4·D·H for H heads of D)."""
    return 2.0 * (query_key_width + value_width)


def _mamba2_shape(options, d_model: int) -> tuple[int, int, int]:
    """Mamba-2's heads H, state size N and head size P."""
    p = options.ssm_head_dim
    return options.expand * d_model // p, options.state_size, p


def _gdn_shape(options, config: ModelConfig) -> tuple[int, int]:
    """Gated DeltaNet's key and value head sizes K, V, as the layer computes them (its key size
    does not fall back to `ModelConfig.head_dim`, as attention's does)."""
    return options.key_dim(config), options.value_dim(config)


def _oryx_flops(options, config: ModelConfig, length: int, attention_fraction: float | None
                ) -> tuple[tuple[AttentionTerm, ...], float]:
    """Oryx (module docstring): its linear mixer's recurrence, and attention over that mixer's
    heads on the attention-mode rows (`attention_fraction`; None: the layer's default_mode)."""
    fraction = float(options.default_mode == "attention" if attention_fraction is None
                     else attention_fraction)
    linear = options.linear_options()
    recurrence = _sequence_flops(options.linear_mixer, linear, config, length, None)[1]
    # Not 4·D·heads: Mamba-2's G heads have keys of N and values of the whole inner width H·P
    # (H/G value heads each); GDN's H heads keys of K and values of V.
    if options.linear_mixer == "mamba2":
        heads, n, p = _mamba2_shape(linear, config.d_model)
        widths = linear.n_groups * n, heads * p
    else:
        k, v = _gdn_shape(linear, config)
        widths = linear.num_heads * k, linear.num_heads * v
    term = AttentionTerm(_pair_flops(*widths), options.attention_options().window, fraction)
    # Every token in attention mode: the lax.cond skips the linear mixer.
    return (term,), (0.0 if fraction == 1 else recurrence)


def _sequence_flops(kind: str, options, config: ModelConfig, length: int,
                    attention_fraction: float | None
                    ) -> tuple[tuple[AttentionTerm, ...], float] | None:
    """(attention terms, recurrence FLOPs per token) of one mixer; None if not modelled.
    `attention_fraction` as in `step_flops`."""
    d = config.d_model
    if kind == "attention":
        width = _head_dim(config, options, options.num_heads) * options.num_heads
        return (AttentionTerm(_pair_flops(width, width), options.window),), 0.0
    if kind == "mamba2":
        heads, n, p = _mamba2_shape(options, d)
        c = options.chunk_size
        return (), options.n_groups * 2 * c * n + heads * (2 * c * p + 4 * n * p)
    if kind == "gdn":
        (k, v), c = _gdn_shape(options, config), options.chunk_size
        return (), options.num_heads * (2 * c * (3 * k + 2 * v) + c * c / 3 + 6 * k * v)
    if kind == "oryx":
        return _oryx_flops(options, config, length, attention_fraction)
    if kind in ("ffn", "dual_ffn"):
        return (), 0.0
    if kind == "gss":
        channels, modes = options.resolved_ssm_dim(config), options.state_size
        return (), 2 * options.chunk_size * channels + 8 * channels * modes
    if hasattr(options, "branches"):  # a composite block: the sum over its branches
        parts = [_sequence_flops(branch.type, branch_options, config, length, attention_fraction)
                 for branch, (_, _, branch_options) in zip(
                     options.branches, options.branch_options(config), strict=True)]
        if any(part is None for part in parts):
            return None
        return sum((p[0] for p in parts), ()), sum(p[1] for p in parts)
    if kind in ("gsa", "nha"):
        k = _head_dim(config, options, options.num_heads)
        m, c = options.num_slots, options.chunk_size
        window = getattr(options, "window", 0)
        width = k * options.num_heads
        attention = () if window == 0 else (AttentionTerm(_pair_flops(width, width), window),)
        if kind == "nha" and (window is None or window >= length):
            return attention, 0.0  # slots stay empty: causal attention
        # Two chunked gated linear-attention passes (keys → slot logits, slots → values),
        # each 2C(K + M) intra-chunk and 4KM state work per head.
        recurrence = options.num_heads * (4 * c * (k + m) + 8 * k * m)
        return attention, recurrence
    return None


def step_flops(config: ModelConfig, length: int, params: nnx.State | None = None, *,
               attention_fraction: float | None = None) -> StepFlops:
    """Forward FLOPs per token of `config` on sequences of `length` tokens; `params` as in
    `matmul_params` (a caller that has traced the model passes them). `attention_fraction`:
    the expected share of Oryx tokens in attention mode, `modes.attention_fraction` of the
    training schedule (None: each Oryx layer's `default_mode`, as a step without modes runs)."""
    check_count("step_flops", "length", length, 1)
    if attention_fraction is not None:
        check_finite("step_flops", "attention_fraction", attention_fraction, 0.0, high=1.0)
    attention, recurrence = (), 0.0
    uncounted = []
    for i, spec in enumerate(config.layers):
        options = config.block_options(i)
        sequence = _sequence_flops(spec.type, options, config, length, attention_fraction)
        if sequence is None:
            uncounted.append(spec.type)
            continue
        attention += sequence[0]
        recurrence += sequence[1]
    return StepFlops(matmul=2.0 * matmul_params(config, params), attention_terms=attention,
                     recurrence=recurrence, length=length,
                     uncounted=tuple(sorted(set(uncounted))))
