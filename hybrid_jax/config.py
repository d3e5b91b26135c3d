"""Typed, frozen configs: the model (a tuple of block specs), training, mesh and experiments.

Configs are validated at construction: an impossible value raises `ValueError` naming the field,
what was found and what is allowed, before anything is traced. `--set key=value` overrides and
JSON round trips go through `replace_path`, `to_dict` and `from_dict`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hybrid_jax.ops.attention import ROPE_SCALING_RULE, is_rope_scaling
from hybrid_jax.registry import Registry, block_type, did_you_mean

DTYPES = ("float32", "bfloat16", "float16")
POSITION_EMBEDDINGS = ("none", "learned")


def _fail(owner: str, name: str, value: Any, expected: str) -> None:
    raise ValueError(f"{owner}.{name}={value!r}: {expected}")


def _union_members(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


_SCALARS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _is_instance(value: Any, kind: type) -> bool:
    if kind is float:  # an int is a fine float; a bool is neither an int nor a float here
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


@functools.cache
def _scalar_fields(cls: type) -> tuple[tuple[str, tuple[type, ...]], ...]:
    """(name, allowed types) of the fields of `cls` typed int / float / bool / str (or None)."""
    fields = []
    for name, hint in typing.get_type_hints(cls).items():
        members = _union_members(hint)
        if members and all(m in _SCALARS or m is type(None) for m in members):
            fields.append((name, members))
    return tuple(fields)


def check_types(config: Any) -> None:
    """Raises ValueError naming the first scalar field whose value has the wrong type (e.g. a
    float step count or a string learning rate from the Python API)."""
    check_values(type(config), {f.name: getattr(config, f.name)
                                for f in dataclasses.fields(config)})


def check_values(cls: type, values: Mapping[str, Any]) -> None:
    """`check_types` for the field `values` a dataclass `cls` is about to be built from."""
    for name, kinds in _scalar_fields(cls):
        if name not in values:
            continue
        value = values[name]
        if not any(value is None if k is type(None) else _is_instance(value, k) for k in kinds):
            expected = " or ".join("None" if k is type(None) else _SCALARS[k] for k in kinds)
            _fail(cls.__name__, name, value, f"expected {expected}")


def _check_nested(config: Any, owner: str, **classes: type) -> None:
    """Raises ValueError naming the first field whose value is not an instance of its class."""
    for name, cls in classes.items():
        if not isinstance(getattr(config, name), cls):
            _fail(owner, name, getattr(config, name), f"expected a {cls.__name__}")


def check_finite(owner: str, name: str, value: float, low: float, *, open_low: bool = False,
                 high: float | None = None, open_high: bool = False) -> None:
    """Raises ValueError unless `value` is finite and inside the interval."""
    ok = math.isfinite(value) and (value > low if open_low else value >= low)
    if ok and high is not None:
        ok = value < high if open_high else value <= high
    if not ok:
        lo = f"{'(' if open_low else '['}{low}"
        hi = "inf)" if high is None else f"{high}{')' if open_high else ']'}"
        _fail(owner, name, value, f"expected a finite value in {lo}, {hi}")


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer of a model: a registered block type and its option overrides."""

    type: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, spec: str | LayerSpec | Mapping[str, Any]) -> LayerSpec:
        if isinstance(spec, LayerSpec):
            return spec
        if isinstance(spec, str):
            return cls(spec)
        if isinstance(spec, Mapping) and "type" in spec:
            options = {k: v for k, v in spec.items() if k != "type"}
            return layer(spec["type"], **options)
        raise ValueError(
            f"a layer must be a block-type name, a LayerSpec or a dict with 'type', got {spec!r}"
        )

    def to_json(self) -> str | dict[str, Any]:
        if not self.options:
            return self.type
        return {"type": self.type, **{k: _json_value(v) for k, v in self.options}}


def layer(type: str, **options: Any) -> LayerSpec:
    """`layer("attention", window=16)`: a layer spec with option overrides.

    Nested specs (a parallel block's `branches`) may be given as names, dicts with "type" or
    `LayerSpec`s; lists become tuples, so a spec stays hashable and JSON round-trips.
    """
    return LayerSpec(type, tuple(sorted((k, _hashable(v)) for k, v in options.items())))


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping) and "type" in value:
        return LayerSpec.parse(value)
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def _json_value(value: Any) -> Any:
    if isinstance(value, LayerSpec):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


# "kernels": recompute the block but keep what the Pallas kernels' backward needs (their
# outputs and residuals), so their forward runs once (pallas_kernels/residuals.py).
REMAT_POLICIES = ("none", "full", "dots_saveable", "kernels")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder language model: embeddings, `layers` (block specs), final norm, LM head.

    `layers` entries are block-type names or `layer(name, **options)`; a block option with the
    same name as a field here (`num_heads`, `window`, ...) defaults to this config's value, so
    `ModelConfig(layers=("mamba2", "mamba2", "attention") * 4, window=64)` is a hybrid whose
    attention layers use a 64-token window.

    `position_embedding`: "none" (positions reach the model only through RoPE in its attention
    layers, scaled by `rope_fraction`) or "learned" (GPT-2 style: a trained `[max_positions,
    d_model]` table added to the token embeddings; sequences and decode caches longer than
    `max_positions` are an error). `max_positions` is set exactly when the table is learned.
    """

    layers: tuple[LayerSpec, ...] = ("attention", "attention")
    vocab_size: int = 256
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: num_heads (multi-head attention)
    head_dim: int | None = None  # None: d_model // num_heads
    ffn_dim: int | None = None  # SwiGLU width; None: 8/3·d_model rounded up to 32; 0: no FFN
    window: int | None = None  # default attention window; None = full causal
    rope_theta: float = 10000.0
    rope_fraction: float = 1.0
    # Llama-3 frequency scaling: (factor, low_freq_factor, high_freq_factor, original_max_pos)
    rope_scaling: tuple[float, float, float, float] | None = None
    qkv_bias: bool = False  # biases on the q, k, v projections of attention layers (Qwen2)
    position_embedding: str = "none"  # "none" | "learned" (absolute, added to the embeddings)
    max_positions: int | None = None  # length of the learned table; None without one
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    init_std: float = 0.02
    dtype: str = "float32"  # compute dtype; parameters stay in param_dtype
    param_dtype: str = "float32"
    remat: str = "none"  # per block in the backward pass: one of REMAT_POLICIES
    scan_layers: bool = False  # one compiled layer group under nnx.scan (fast compiles)

    def __post_init__(self) -> None:
        own = "ModelConfig"
        if isinstance(self.layers, str) or not isinstance(self.layers, Sequence):
            _fail(own, "layers", self.layers, "expected a tuple of block types or layer specs")
        object.__setattr__(self, "layers", tuple(LayerSpec.parse(s) for s in self.layers))
        check_types(self)
        if self.rope_scaling is not None:
            check_rope_scaling(own, self.rope_scaling)
            object.__setattr__(self, "rope_scaling", tuple(self.rope_scaling))
        for name in ("vocab_size", "d_model", "num_heads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                _fail(own, name, getattr(self, name), "expected a positive integer")
        if not self.layers:
            _fail(own, "layers", self.layers, "expected at least one layer")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"{own}.num_heads={self.num_heads} does not divide d_model={self.d_model} "
                "(set head_dim to decouple them)"
            )
        if self.head_dim is not None and self.head_dim < 1:
            _fail(own, "head_dim", self.head_dim, "expected a positive integer or None")
        kv = self.kv_heads
        if kv < 1 or self.num_heads % kv:
            raise ValueError(
                f"{own}.num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}"
            )
        if self.window is not None and self.window < 0:
            _fail(own, "window", self.window, "expected None (full causal) or an integer >= 0")
        if self.ffn_dim is not None and self.ffn_dim < 0:
            _fail(own, "ffn_dim", self.ffn_dim, "expected an integer >= 0 (0: no FFN) or None")
        if not 0.0 <= self.rope_fraction <= 1.0:
            _fail(own, "rope_fraction", self.rope_fraction, "expected a value in [0, 1]")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            _fail(own, "position_embedding", self.position_embedding,
                  f"expected one of {list(POSITION_EMBEDDINGS)}")
        learned = self.position_embedding == "learned"
        if learned and (not isinstance(self.max_positions, int) or self.max_positions < 1):
            _fail(own, "max_positions", self.max_positions,
                  "expected a positive integer with position_embedding='learned'")
        if not learned and self.max_positions is not None:
            _fail(own, "max_positions", self.max_positions,
                  f"expected None with position_embedding={self.position_embedding!r} "
                  "(the table length of position_embedding='learned')")
        check_finite(own, "rope_theta", self.rope_theta, 0.0, open_low=True)
        check_finite(own, "norm_eps", self.norm_eps, 0.0, open_low=True, high=1.0)
        check_finite(own, "init_std", self.init_std, 0.0, open_low=True)
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                _fail(own, name, getattr(self, name), f"expected one of {list(DTYPES)}")
        if self.remat not in REMAT_POLICIES:
            _fail(own, "remat", self.remat, f"expected one of {list(REMAT_POLICIES)}")
        for index in range(len(self.layers)):
            self.block_options(index)

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def resolved_ffn_dim(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else _round_up(8 * self.d_model // 3, 32)

    def block_options(self, index: int) -> Any:
        """The options dataclass of layer `index`, with model-level defaults filled in."""
        spec = self.layers[index]
        where = f"ModelConfig.layers[{index}] ({spec.type!r})"
        try:
            kind = block_type(spec.type)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return resolve_options(kind.options, self, spec.options, where, kind.defaults)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def check_rope_scaling(owner: str, scaling: Any) -> None:
    """Raises ValueError naming `owner.rope_scaling` unless `rope_frequencies` can take
    `scaling` (`ops.attention.ROPE_SCALING_RULE`). ModelConfig's and each block's own."""
    if not is_rope_scaling(scaling):
        sequence = isinstance(scaling, Sequence) and not isinstance(scaling, str)
        _fail(owner, "rope_scaling", tuple(scaling) if sequence else scaling, ROPE_SCALING_RULE)


def check_finite_options(owner: str, options: Any, names: Sequence[str]) -> None:
    """Raises ValueError naming the first field of `names` in `options` that is not a finite
    number: an initialisation range with inf or NaN (dt_max=inf) drew non-finite parameters,
    and the model's outputs were NaN without an error."""
    for name in names:
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            _fail(owner, name, value, "expected a finite number")


def check_rope_theta(owner: str, theta: Any) -> None:
    """Raises ValueError naming `owner.rope_theta` unless it is a finite number > 0 (RoPE's
    base; `rope_frequencies` refuses others only at the first forward call, naming no layer).
    Each block's own; ModelConfig checks its field with the other numbers."""
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        _fail(owner, "rope_theta", theta, "expected a finite number > 0")
    check_finite(owner, "rope_theta", theta, 0.0, open_low=True)


_MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelConfig)) - {"layers"}


def resolve_options(options_cls: type, model: ModelConfig, overrides: Sequence[tuple[str, Any]],
                    where: str, defaults: Sequence[tuple[str, Any]] = ()) -> Any:
    """`options_cls` of a block or mixer: the model's fields of the same names, then the
    registered `defaults`, then `overrides`; checked against `model` (its `check(model)`)."""
    fields = {f.name for f in dataclasses.fields(options_cls)}
    overrides = dict(overrides)
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}"
                         f"{did_you_mean(unknown[0], fields)}; allowed: {sorted(fields)}")
    values = {name: getattr(model, name) for name in fields if name in _MODEL_FIELDS}
    values.update(defaults)
    values.update(overrides)
    try:
        check_values(options_cls, values)
        options = options_cls(**values)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
    check = getattr(options, "check", None)
    if check is not None:
        try:
            check(model)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return options


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh sizes; one axis may be -1 (all remaining devices).

    `axis_rules` names the logical-axis rule set (`hybrid_jax.sharding.AXIS_RULE_SETS`, e.g.
    "default"); `axis_rule_overrides` changes single rules, each "logical=mesh axes" with axes
    joined by "+" or "none", e.g. `("embed=none", "mlp=tensor+fsdp")`.

    `seq` splits the time axis of activations (context parallelism: every mixer then runs its
    context-parallel form, `hybrid_jax.ops.context_parallel`).
    """

    data: int = -1
    fsdp: int = 1
    seq: int = 1
    tensor: int = 1
    axis_rules: str = "default"
    axis_rule_overrides: tuple[str, ...] = ()

    def sizes(self) -> tuple[int, int, int, int]:
        """`(data, fsdp, seq, tensor)`: the order of `hybrid_jax.sharding.MESH_AXES`."""
        return (self.data, self.fsdp, self.seq, self.tensor)

    def __post_init__(self) -> None:
        check_types(self)
        overrides = self.axis_rule_overrides
        if (isinstance(overrides, str) or not isinstance(overrides, Sequence)
                or not all(isinstance(o, str) for o in overrides)):
            _fail("MeshConfig", "axis_rule_overrides", overrides,
                  "expected a tuple of 'logical=mesh axes' strings")
        object.__setattr__(self, "axis_rule_overrides", tuple(overrides))
        sizes = self.sizes()
        if sum(s == -1 for s in sizes) > 1 or any(s == 0 or s < -1 for s in sizes):
            raise ValueError(
                f"MeshConfig(data={self.data}, fsdp={self.fsdp}, seq={self.seq}, "
                f"tensor={self.tensor}): expected positive sizes with at most one -1 (the "
                "remaining devices)"
            )

    def shape(self, num_devices: int) -> tuple[int, int, int, int]:
        sizes = list(self.sizes())
        need = math.prod(s for s in sizes if s != -1)  # with a -1 axis: at least that many
        if need > num_devices:
            raise ValueError(f"MeshConfig {sizes} needs {need} devices, only {num_devices} are "
                             "available: lower train.mesh.data / fsdp / seq / tensor, or, on a "
                             f"CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={need} "
                             "before starting for that many fake devices")
        if -1 in sizes:
            if num_devices % need:
                raise ValueError(f"MeshConfig {sizes}: {need} does not divide the "
                                 f"{num_devices} available devices")
            sizes[sizes.index(-1)] = num_devices // need
        return tuple(sizes)


MODE_PATTERNS = ("none", "random_chunks", "attention", "linear")


@dataclasses.dataclass(frozen=True)
class ModeSchedule:
    """Oryx's training mode schedule (`hybrid_jax.modes`): "random_chunks" (chunks of `chunk`
    tokens, each in attention mode with probability `attention_prob`), "attention" / "linear"
    (every token), or "none" (no mode array: the blocks' default mode)."""

    pattern: str = "none"  # (not `kind`: that key names data configs in config JSON)
    chunk: int = 128
    attention_prob: float = 0.5

    def __post_init__(self) -> None:
        check_types(self)
        if self.pattern not in MODE_PATTERNS:
            _fail("ModeSchedule", "pattern", self.pattern,
                  f"expected one of {list(MODE_PATTERNS)}")
        if self.chunk < 1:
            _fail("ModeSchedule", "chunk", self.chunk, "expected a positive integer")
        check_finite("ModeSchedule", "attention_prob", self.attention_prob, 0.0, high=1.0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine decays to learning_rate * min_lr_ratio
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float | None = 1.0  # global-norm clipping; None disables
    seed: int = 0
    log_every: int = 50  # a metrics line every this many steps, and at the last step
    eval_every: int = 0  # 0: evaluate only at the end
    eval_batches: int = 8  # 0: the whole eval split (text data)
    checkpoint_every: int = 0  # 0: checkpoint only at the end and when interrupted
    keep_checkpoints: int = 3  # the most recent checkpoints kept on disk
    async_checkpoint: bool = True  # write checkpoints in the background
    on_nonfinite: str = "stop"  # "stop", or "rollback" to the last checkpoint skipping the batch
    grad_accum: int = 1  # micro-batches per step (batch_size / grad_accum examples each)
    prefetch: int = 2  # batches placed on the devices ahead of the step (0: none)
    peak_tflops: float = 0.0  # per-device peak for MFU; 0: the device's dense bf16 peak if known
    freeze: str = ""  # regex of parameter names never updated, e.g. "/ffn/" (frozen MLPs)
    mesh: MeshConfig = MeshConfig()
    mode_schedule: ModeSchedule = ModeSchedule()  # per-token modes of Oryx models
    stop_grace_s: float = 10.0  # after SIGTERM/SIGINT: seconds for the loop to reach its
    # checkpoint before the process is ended anyway (a step stuck in a device computation)
    time_limit_s: float = 0.0  # > 0: the loop (compiles included) stops at the first step
    # past this many seconds, then checkpoints and evaluates as at the end; 0: no limit

    def __post_init__(self) -> None:
        own = "TrainConfig"
        check_types(self)
        _check_nested(self, own, mesh=MeshConfig, mode_schedule=ModeSchedule)
        for name in ("steps", "batch_size", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                _fail(own, name, getattr(self, name), "expected a positive integer")
        for name in ("warmup_steps", "eval_every", "eval_batches",
                     "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                _fail(own, name, getattr(self, name), "expected an integer >= 0")
        if self.grad_accum < 1 or self.batch_size % self.grad_accum:
            _fail(own, "grad_accum", self.grad_accum,
                  f"expected a divisor of batch_size={self.batch_size}")
        if self.prefetch < 0:
            _fail(own, "prefetch", self.prefetch, "expected >= 0")
        check_finite(own, "peak_tflops", self.peak_tflops, 0.0)
        if self.warmup_steps > self.steps:
            _fail(own, "warmup_steps", self.warmup_steps,
                  f"expected <= steps={self.steps} (the learning rate would never reach its "
                  "peak); lower train.warmup_steps too")
        check_finite(own, "learning_rate", self.learning_rate, 0.0, open_low=True)
        check_finite(own, "min_lr_ratio", self.min_lr_ratio, 0.0, high=1.0)
        check_finite(own, "weight_decay", self.weight_decay, 0.0)
        for name in ("beta1", "beta2"):
            check_finite(own, name, getattr(self, name), 0.0, high=1.0, open_high=True)
        if self.grad_clip is not None and not (math.isfinite(self.grad_clip)
                                               and self.grad_clip > 0):
            _fail(own, "grad_clip", self.grad_clip,
                  "expected None (no clipping) or a finite value > 0")
        check_finite(own, "stop_grace_s", self.stop_grace_s, 0.0, open_low=True)
        check_finite(own, "time_limit_s", self.time_limit_s, 0.0)
        if self.keep_checkpoints < 1:
            _fail(own, "keep_checkpoints", self.keep_checkpoints, "expected >= 1")
        if self.on_nonfinite not in ("stop", "rollback"):
            _fail(own, "on_nonfinite", self.on_nonfinite, "expected 'stop' or 'rollback'")
        try:
            re.compile(self.freeze)
        except re.error as e:
            _fail(own, "freeze", self.freeze, f"expected a regular expression ({e})")


# Data configs register here by kind so experiment configs can name and deserialise them.
DATA_KINDS = Registry("data kind", load=("hybrid_jax.data",))


def register_data(kind: str) -> Callable[[type], type]:
    """Class decorator: a frozen data-config dataclass known by `kind` in JSON and overrides."""

    def decorate(cls: type) -> type:
        cls.kind = kind
        own_checks = getattr(cls, "__post_init__", None)

        def post_init(self) -> None:  # field types first: range checks compare numbers
            check_types(self)
            _check_example_counts(self)
            if own_checks is not None:
                own_checks(self)

        cls.__post_init__ = post_init
        return DATA_KINDS.register(kind, cls)

    return decorate


def _check_example_counts(config: Any) -> None:
    for name in ("vocab_size", "seq_len", "num_train_examples", "num_eval_examples"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value < 1:
            _fail(type(config).__name__, name, value, "expected a positive integer")


def data_config_class(kind: str) -> type:
    return DATA_KINDS.get(kind)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A named, runnable experiment: model, data, training."""

    name: str
    model: ModelConfig
    data: Any  # a registered data config (see register_data)
    train: TrainConfig = TrainConfig()
    description: str = ""

    def __post_init__(self) -> None:
        own = "ExperimentConfig"
        check_types(self)
        _check_nested(self, own, model=ModelConfig, train=TrainConfig)
        if type(self.data) not in (DATA_KINDS.get(kind) for kind in DATA_KINDS.names()):
            _fail(own, "data", self.data,
                  f"expected a registered data config (kinds: {DATA_KINDS.names()})")


# --- overrides and JSON ------------------------------------------------------------------------


def as_json(config: Any) -> Any:
    """`to_dict(config)` as its JSON reads back (tuples as lists): the form in which a saved
    config and a live one compare equal exactly when they would be saved alike."""
    return json.loads(json.dumps(to_dict(config)))


def to_dict(config: Any) -> Any:
    """A JSON-ready dict of a config dataclass (data configs carry their `kind`)."""
    if isinstance(config, LayerSpec):
        return config.to_json()
    if dataclasses.is_dataclass(config):
        out = {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
        if hasattr(type(config), "kind"):
            out = {"kind": type(config).kind, **out}
        return out
    if isinstance(config, tuple | list):
        return [to_dict(x) for x in config]
    return config


def from_dict(cls: type, values: Mapping[str, Any]) -> Any:
    """Inverse of `to_dict`; unknown keys raise ValueError naming the allowed ones."""
    if cls is Any:
        values = dict(values)
        cls = data_config_class(values.pop("kind", None))
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kind = getattr(cls, "kind", None)  # data configs only
    unknown = sorted(set(values) - set(names) - ({"kind"} if kind is not None else set()))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}; allowed: {names}")
    if values.get("kind", kind) != kind:
        raise ValueError(f"{cls.__name__}: kind={values['kind']!r}, expected {kind!r}")
    kwargs = {}
    for name, value in values.items():
        if name == "kind":
            continue
        kwargs[name] = _from_json_value(hints[name], value)
    return cls(**kwargs)


def _from_json_value(hint: Any, value: Any) -> Any:
    if hint is Any and isinstance(value, Mapping):
        return from_dict(Any, value)
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return from_dict(hint, value)
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        return tuple(value)
    return value


def replace_path(config: Any, path: str, value: Any) -> Any:
    """Returns `config` with the dotted field `path` (e.g. "train.steps") set to `value`.

    A string value is parsed by the field's type (int, float, bool, None, JSON for tuples).
    `model.<option>` that is not a ModelConfig field sets that block option on every layer whose
    block type has it, e.g. `model.num_slots=16`.
    """
    return _replace_all(config, {path: value})


def _replace_all(config: Any, changes: Mapping[str, Any]) -> Any:
    # All changes to one dataclass are applied together, so validation sees the final values
    # (e.g. data.seq_len=16 and data.num_kv_pairs=2 in either order).
    if not dataclasses.is_dataclass(config):
        raise ValueError(f"cannot set {sorted(changes)}: {type(config).__name__} has no fields")
    names = [f.name for f in dataclasses.fields(config)]
    hints = typing.get_type_hints(type(config))
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    layer_options: dict[str, Any] = {}
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        if head not in names:
            if isinstance(config, ModelConfig) and not rest:
                layer_options[head] = value
                continue
            raise ValueError(f"unknown config key {head!r} in {type(config).__name__}"
                             f"{did_you_mean(head, names)}; allowed: {names}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = parse_value(hints[head], value, head)
    for head, sub in nested.items():
        direct[head] = _replace_all(direct.get(head, getattr(config, head)), sub)
    if layer_options:
        direct["layers"] = _with_layer_options(direct.get("layers", config.layers), layer_options)
    return dataclasses.replace(config, **direct)


def _with_layer_options(layers: Sequence[Any], options: Mapping[str, Any]) -> tuple:
    """Sets each option on every layer whose block type has it; unknown names fail."""
    layers = [LayerSpec.parse(spec) for spec in layers]
    for name, value in options.items():
        hit = False
        for i, spec in enumerate(layers):
            hints = typing.get_type_hints(block_type(spec.type).options)
            if name in hints:
                hit = True
                layers[i] = layer(spec.type, **{**dict(spec.options),
                                                name: parse_value(hints[name], value, name)})
        if not hit:
            raise ValueError(f"unknown model key {name!r}: neither a ModelConfig field "
                             f"({sorted(_MODEL_FIELDS)}) nor an option of any of its layers")
    return tuple(layers)


def parse_value(hint: Any, value: Any, name: str = "value") -> Any:
    """Converts a command-line string to the type `hint` (non-strings pass through)."""
    if not isinstance(value, str):
        return value
    options = _union_members(hint)
    if value.lower() in ("none", "null") and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _parse_as(option, value, name)
        except (ValueError, json.JSONDecodeError) as e:
            errors.append(str(e))
    raise ValueError(f"cannot parse {name}={value!r} as {hint}: {'; '.join(errors)}")


def _parse_as(kind: Any, value: str, name: str = "value") -> Any:
    if kind is bool:
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"expected true/false, got {value!r}")
    if kind is int:
        return int(value)
    if kind is float:
        return float(value)
    if kind is Any:  # ExperimentConfig.data: a kind's defaults (data=text), or JSON of one
        if not value.lstrip().startswith("{"):
            return data_config_class(value)()
        what = 'a JSON object of a data config, e.g. \'{"kind": "text", "path": ...}\''
        parsed = _json(value, what)
        if not isinstance(parsed, dict):
            raise ValueError(f"expected {what}, got {value!r}")
        return from_dict(Any, parsed)
    if kind is str:
        return value
    if typing.get_origin(kind) is tuple:
        parsed = _json(value, 'a JSON list, e.g. \'["a", "b"]\'')
        if not isinstance(parsed, list):
            raise ValueError(f"expected a JSON list, got {value!r}")
        return tuple(parsed)
    if kind is ModelConfig and not value.lstrip().startswith("{"):
        from hybrid_jax import presets  # a preset's architecture, e.g. model=pha-tiny

        return presets.get(value)
    if dataclasses.is_dataclass(kind):
        what = (f"a JSON object of {kind.__name__}'s fields, e.g. '{{\"{_first_field(kind)}\": "
                f"...}}' (or one field at a time: {name}.FIELD=VALUE)")
        parsed = _json(value, what)
        if not isinstance(parsed, dict):  # from_dict raised a bare TypeError on a number
            raise ValueError(f"expected {what}, got {value!r}")
        return from_dict(kind, parsed)
    raise ValueError(f"unsupported type {kind}")


def _json(value: str, what: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"expected {what}, got {value!r} (not JSON: {e})") from None


def _first_field(kind: Any) -> str:
    return dataclasses.fields(kind)[0].name


def apply_overrides(config: Any, assignments: Sequence[str]) -> Any:
    """Applies `key=value` strings (a later one wins over an earlier one for the same key)."""
    changes: dict[str, str] = {}
    for assignment in assignments:
        path, sep, value = assignment.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"override {assignment!r} must have the form key=value")
        changes.pop(path.strip(), None)
        changes[path.strip()] = value.strip()
    return _replace_all(config, changes) if changes else config
