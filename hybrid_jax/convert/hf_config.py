"""Hugging Face `config.json` of a Llama-family model ↔ our `ModelConfig`.

Llama 2/3, Qwen2 and Mistral are one architecture here: pre-norm GQA attention with split-half
RoPE (our `ops.apply_rope` layout, so no permutation of q/k is needed) and a SwiGLU MLP, every
layer an `"attention"` block. Their differences are config: q/k/v biases (Qwen2), sliding
windows (Mistral; Qwen2's `layer_types`), tied embeddings, RoPE theta and Llama-3 frequency
scaling, RMSNorm eps. Anything else (other RoPE scalings, MLP or output biases, other
activations) is refused with the field and value named, never approximated.
"""

from __future__ import annotations

from typing import Any

from hybrid_jax.config import ModelConfig, layer

MODEL_TYPES = ("llama", "mistral", "qwen2")
QWEN2_MAX_WINDOW_LAYERS = 28  # Qwen2Config's default: layers from here on slide
# MistralConfig's and Qwen2Config's `sliding_window` when the key is absent (an explicit null
# is full attention).
DEFAULT_SLIDING_WINDOW = 4096
# MistralConfig's and Qwen2Config's `num_key_value_heads` when the key is absent (LlamaConfig's,
# and an explicit null in any of them: num_attention_heads, multi-head attention).
DEFAULT_KV_HEADS = {"mistral": 8, "qwen2": 32}
LLAMA3_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                       "original_max_position_embeddings")


def _require(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ValueError(f"Hugging Face config.json has no {key!r}: expected a Llama, Qwen2 or "
                         "Mistral config")
    return hf[key]


def _refuse(key: str, value: Any, expected: str) -> None:
    raise ValueError(f"Hugging Face config {key}={value!r} is not supported: expected {expected}")


def _rope(hf: dict[str, Any]) -> tuple[float, tuple[float, ...] | None]:
    """(theta, Llama-3 scaling or None) from `rope_theta`/`rope_scaling` or `rope_parameters`."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or params)
    _one_rope(hf, params)
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    # transformers' RoPE reads a partial rotation (its channel layout is not our rope_fraction's):
    # refused, not ignored.
    fraction = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:
        _refuse("partial_rotary_factor", fraction, "1.0 (RoPE on every channel)")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is None and set(scaling) - {"rope_theta"}:  # transformers fails on such a config
        _refuse("rope_scaling", scaling, "a 'rope_type' ('default' or 'llama3') beside its "
                "parameters")
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        _refuse("rope type", kind, "'default' or 'llama3'")
    missing = [k for k in LLAMA3_SCALING_KEYS if k not in scaling]
    if missing:
        _refuse("rope_scaling", scaling, f"every llama3 parameter (missing {missing})")
    return theta, tuple(float(scaling[k]) for k in LLAMA3_SCALING_KEYS)


def _one_rope(hf: dict[str, Any], params: dict[str, Any]) -> None:
    """Refuses a config.json that says its RoPE twice, differently: the newer
    `rope_parameters` beside the older top-level `rope_theta` / `rope_scaling`. Which one
    transformers follows has changed between its versions; either choice would be a guess."""
    thetas = {key: value for key, value in (("rope_theta", hf.get("rope_theta")),
                                            ("rope_parameters.rope_theta",
                                             params.get("rope_theta")),
                                            ("rope_scaling.rope_theta",
                                             (hf.get("rope_scaling") or {}).get("rope_theta")))
              if value is not None}
    if len({float(v) for v in thetas.values()}) > 1:
        _refuse("RoPE theta", thetas, "one value wherever config.json states it")
    legacy = {k: v for k, v in (hf.get("rope_scaling") or {}).items() if k != "rope_theta"}
    newer = {k: v for k, v in params.items() if k != "rope_theta"}
    if legacy and newer and legacy != newer:
        _refuse("rope_scaling", hf["rope_scaling"], f"the same RoPE as its rope_parameters "
                f"{hf['rope_parameters']} (or only one of the two)")


def _windows(hf: dict[str, Any], num_layers: int) -> list[int | None]:
    """Each layer's sliding window (None: full causal), as transformers decides it: Llama has
    none, Mistral slides every layer (its config class ignores `layer_types`), Qwen2 slides
    the layers `layer_types` (else `max_window_layers`) names, and only with
    `use_sliding_window`. A `sliding_window` or `layer_types` that says otherwise is refused:
    following it, or ignoring it as transformers does, would both be a guess."""
    kind, types = hf["model_type"], hf.get("layer_types")
    if types is not None and (len(types) != num_layers
                              or set(types) - {"full_attention", "sliding_attention"}):
        _refuse("layer_types", types, f"{num_layers} of 'full_attention' / "
                "'sliding_attention'")
    if kind == "llama":
        if hf.get("sliding_window") is not None:
            _refuse("sliding_window", hf["sliding_window"], "null for model_type 'llama' "
                    "(LlamaForCausalLM has no sliding window; a windowed model is 'mistral')")
        windows = [None] * num_layers
    elif kind == "mistral":
        windows = [hf.get("sliding_window", DEFAULT_SLIDING_WINDOW)] * num_layers
    else:  # transformers' Qwen2Config: no window at all without use_sliding_window
        window = (hf.get("sliding_window", DEFAULT_SLIDING_WINDOW)
                  if hf.get("use_sliding_window", False) else None)
        if types is None:
            first = hf.get("max_window_layers", QWEN2_MAX_WINDOW_LAYERS)
            return [window if i >= first else None for i in range(num_layers)]
        windows = [window if t == "sliding_attention" else None for t in types]
    if types is not None and any((t == "sliding_attention") != (w is not None)
                                 for t, w in zip(types, windows, strict=True)):
        keys = ("use_sliding_window", "sliding_window")[kind != "qwen2":]
        _refuse("layer_types", types, f"the layers that {kind} slides by its "
                f"{ {k: hf.get(k) for k in keys} }: "
                f"{['full_attention' if w is None else 'sliding_attention' for w in windows]}")
    return windows


def model_config_from_hf(hf: dict[str, Any], *, dtype: str = "float32") -> ModelConfig:
    """The `ModelConfig` of a Hugging Face Llama / Qwen2 / Mistral config.json dict."""
    kind = _require(hf, "model_type")
    if kind not in MODEL_TYPES:
        _refuse("model_type", kind, f"one of {list(MODEL_TYPES)}")
    if hf.get("hidden_act", "silu") != "silu":
        _refuse("hidden_act", hf["hidden_act"], "'silu'")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            _refuse(key, hf[key], "false (only Qwen2's q/k/v biases are supported)")
    heads, d_model = _require(hf, "num_attention_heads"), _require(hf, "hidden_size")
    num_layers = _require(hf, "num_hidden_layers")
    head_dim = hf.get("head_dim") or d_model // heads
    theta, scaling = _rope(hf)
    windows = _windows(hf, num_layers)
    default = windows[0] if len(set(windows)) == 1 else None
    return ModelConfig(
        layers=tuple("attention" if w == default else layer("attention", window=w)
                     for w in windows),
        vocab_size=_require(hf, "vocab_size"), d_model=d_model, num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", DEFAULT_KV_HEADS.get(kind)) or heads,
        head_dim=None if head_dim * heads == d_model else head_dim,
        ffn_dim=_require(hf, "intermediate_size"), window=default, rope_theta=theta,
        rope_scaling=scaling, qkv_bias=kind == "qwen2", norm_eps=float(hf.get("rms_norm_eps",
                                                                             1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), dtype=dtype,
        param_dtype=dtype)


# Attention options that Hugging Face's config holds once for all layers.
UNIFORM_OPTIONS = ("num_heads", "num_kv_heads", "head_dim", "rope_theta", "rope_scaling",
                   "qkv_bias")


def _exportable(config: ModelConfig) -> list[Any]:
    """The attention options of every layer; refuses what a Llama-family config cannot say."""
    others: dict[str, list[int]] = {}
    for i, spec in enumerate(config.layers):
        if spec.type != "attention":
            others.setdefault(spec.type, []).append(i)
    if others:
        found = ", ".join(f"{kind!r} at layers {where}" for kind, where in others.items())
        raise ValueError(
            "export to Hugging Face writes Llama / Qwen2 / Mistral models, whose every layer is "
            f"an 'attention' block (pre-norm attention then SwiGLU); found {found}. Export the "
            "transformer before converting it; a hybrid stays a run directory")
    if config.position_embedding != "none":
        _cannot_export("position_embedding", config.position_embedding, "'none' (RoPE only)")
    if config.resolved_ffn_dim == 0:
        _cannot_export("ffn_dim", 0, "an FFN in every layer (Llama's SwiGLU MLP)")
    specs = [config.block_options(i) for i in range(len(config.layers))]
    for i, spec in enumerate(specs):
        if spec.cosine:
            _cannot_export(f"layers[{i}].cosine", True, "dot-product attention (False)")
        if spec.rope_fraction != 1.0:
            _cannot_export(f"layers[{i}].rope_fraction", spec.rope_fraction,
                           "1.0 (RoPE on every channel)")
    for name in UNIFORM_OPTIONS:
        values = sorted({getattr(spec, name) for spec in specs}, key=str)
        if len(values) > 1:
            _cannot_export(f"layers' {name}", values, "one value for every layer")
    return specs


def _cannot_export(field: str, value: Any, expected: str) -> None:
    raise ValueError(f"export to Hugging Face: ModelConfig {field}={value!r} has no "
                     f"Llama-family equivalent; expected {expected}")


def hf_config_from_model(config: ModelConfig, base: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
    """A Hugging Face config.json dict for `config` (a Llama-family model: `_exportable`).

    `base` (the imported config.json) keeps what we do not model (token ids, max positions,
    ...); the architecture fields are always written from `config`.
    """
    specs = _exportable(config)
    attention = specs[0]
    windows = [s.window for s in specs]
    window = next((w for w in windows if w is not None), None)
    if any(w not in (None, window) for w in windows):
        raise ValueError(f"export needs one sliding window size, found "
                         f"{sorted(set(windows), key=str)}")
    hf = dict(base or {})
    # Qwen2 always has q/k/v biases, Llama and Mistral never; Llama has no sliding window.
    kind = "qwen2" if attention.qkv_bias else ("mistral" if window else hf.get("model_type",
                                                                               "llama"))
    if kind not in MODEL_TYPES or (kind == "qwen2" and not attention.qkv_bias):
        kind = "llama"
    heads = attention.num_heads
    head_dim = attention.head_dim or config.d_model // heads
    hf.update(
        architectures=[{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                        "mistral": "MistralForCausalLM"}[kind]],
        model_type=kind, vocab_size=config.vocab_size, hidden_size=config.d_model,
        intermediate_size=config.resolved_ffn_dim, num_hidden_layers=len(config.layers),
        num_attention_heads=heads, num_key_value_heads=attention.num_kv_heads or heads,
        head_dim=head_dim, hidden_act="silu", rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings, sliding_window=window)
    hf["dtype" if "dtype" in hf else "torch_dtype"] = config.param_dtype
    hf.pop("rope_parameters", None)
    hf.pop("layer_types", None)
    if kind == "llama":
        hf.update(attention_bias=False, mlp_bias=False)
    if kind == "qwen2":
        hf.update(use_sliding_window=window is not None, max_window_layers=0)
        hf["layer_types"] = ["full_attention" if w is None else "sliding_attention"
                             for w in windows]
    elif window is not None and None in windows:
        raise ValueError("export: a Llama/Mistral config has one window for every layer, "
                         f"found {windows}")
    hf["rope_theta"] = attention.rope_theta
    scaling = attention.rope_scaling
    hf["rope_scaling"] = (None if scaling is None else
                          {"rope_type": "llama3", **dict(zip(LLAMA3_SCALING_KEYS, scaling,
                                                             strict=True))})
    if hf["rope_scaling"]:
        hf["rope_scaling"]["original_max_position_embeddings"] = int(scaling[3])
    return hf
