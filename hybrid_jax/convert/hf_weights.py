"""Parameters of a Hugging Face Llama-family checkpoint ↔ our `LanguageModel`: one name table.

Reading: `model.safetensors`, or the shards that `model.safetensors.index.json` lists, one tensor
at a time. Each parameter is transposed/reshaped into our layout, cast to the model's
`param_dtype` and placed straight into its mesh sharding (`jax.make_array_from_callback`), so
no device ever holds more than its shard: a model larger than one device loads under FSDP.
Host memory holds one tensor at a time (the safetensors files are memory-mapped).

numpy has no bfloat16, so `safetensors`' numpy reader refuses bf16 checkpoints (most of them);
tensors are read with its `flax` reader pinned to the host CPU device instead and viewed as
numpy (ml_dtypes' bfloat16). Writing mirrors it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from hybrid_jax.config import ModelConfig
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.sharding import variable_sharding
from hybrid_jax.train.checkpoint import leaf_name

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# (Hugging Face name, our name, kind); "{i}" is the layer index. torch.nn.Linear stores
# W[out, in]; our kernels are [*in, *out] with heads explicit, so a "linear" tensor is
# transposed and reshaped: "in" when our kernel's first axis is the whole input ([D, H, K]),
# "out" when its last axis is the whole output (o_proj's [H, K, D]). "table" is the same
# array (the embedding rows), "vector" the same values flat in HF (norm scales, biases [H, K]).
_ATTENTION = ("q_proj", "k_proj", "v_proj")
NAME_TABLE: tuple[tuple[str, str, str], ...] = (
    ("model.embed_tokens.weight", "embed/table", "table"),
    ("model.norm.weight", "final_norm/scale", "vector"),
    ("lm_head.weight", "lm_head/kernel", "in"),
    ("model.layers.{i}.input_layernorm.weight", "blocks/{i}/mixer_norm/scale", "vector"),
    ("model.layers.{i}.post_attention_layernorm.weight", "blocks/{i}/ffn_norm/scale", "vector"),
    *((f"model.layers.{{i}}.self_attn.{p}.weight", f"blocks/{{i}}/mixer/{p}/kernel", "in")
      for p in _ATTENTION),
    *((f"model.layers.{{i}}.self_attn.{p}.bias", f"blocks/{{i}}/mixer/{p}/bias", "vector")
      for p in _ATTENTION),
    ("model.layers.{i}.self_attn.o_proj.weight", "blocks/{i}/mixer/o_proj/kernel", "out"),
    *((f"model.layers.{{i}}.mlp.{p}_proj.weight", f"blocks/{{i}}/ffn/{p}/kernel", "in")
      for p in ("gate", "up", "down")),
)
# Buffers that some checkpoints store and that are recomputed, never loaded.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def name_map(num_layers: int) -> dict[str, tuple[str, str]]:
    """Our parameter name → (Hugging Face name, kind), for a model of `num_layers` layers."""
    names = {}
    for hf, ours, kind in NAME_TABLE:
        for i in range(num_layers) if "{i}" in ours else (None,):
            names[ours.format(i=i)] = (hf.format(i=i), kind)
    return names


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The Hugging Face shape of a parameter of ours with `shape` (see NAME_TABLE)."""
    if kind == "in":
        return (math.prod(shape[1:]), shape[0])
    if kind == "out":
        return (shape[-1], math.prod(shape[:-1]))
    return shape if kind == "table" else (math.prod(shape),)


def to_ours(tensor: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """A Hugging Face tensor in our layout `shape` (see NAME_TABLE)."""
    if tensor.shape != hf_shape(kind, shape):
        raise ValueError(f"expected shape {hf_shape(kind, shape)} (the config's), found "
                         f"{tensor.shape}")
    return (tensor.T if kind in ("in", "out") else tensor).reshape(shape)


def to_hf(value: np.ndarray, kind: str) -> np.ndarray:
    """Inverse of `to_ours`: torch.nn.Linear's `[out, in]`, or the flat vector / table."""
    if kind == "in":
        return np.ascontiguousarray(value.reshape(value.shape[0], -1).T)
    if kind == "out":
        return np.ascontiguousarray(value.reshape(-1, value.shape[-1]).T)
    return value if kind == "table" else value.reshape(-1)


def _host_device():
    return jax.default_device(jax.devices("cpu")[0])


class SafetensorsDir:
    """The tensors of a Hugging Face model directory, by name."""

    def __init__(self, directory: str | Path):
        from safetensors import safe_open

        self.directory, self._open = Path(directory), safe_open
        index, single = self.directory / INDEX_FILE, self.directory / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise ValueError(f"{index}: expected JSON with a 'weight_map' ({e})") from None
            self.files = {name: self.directory / file for name, file in weight_map.items()}
        elif single.is_file():
            with self._opened(single) as f:
                self.files = dict.fromkeys(f.keys(), single)
        else:
            pickled = sorted(p.name for p in self.directory.glob("*.bin"))
            raise FileNotFoundError(
                f"{self.directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}: expected a "
                "Hugging Face model directory" + (f" (found {pickled}: PyTorch pickles are not "
                                                  "read; save the model as safetensors)"
                                                  if pickled else ""))

    def names(self) -> list[str]:
        return sorted(self.files)

    def get(self, name: str) -> np.ndarray:
        """The tensor `name`, refused unless it holds finite floating-point values (integer
        tensors are a quantized checkpoint's, which a cast would turn into noise)."""
        if name not in self.files:
            raise ValueError(f"tensor {name!r} not found (a Llama-family checkpoint of another "
                             "shape?)")
        with _host_device(), self._opened(self.files[name]) as f:
            if name not in f.keys():  # safetensors' own error names neither file nor index
                raise ValueError(f"tensor {name!r} is not in {self.files[name].name}, the file "
                                 f"{INDEX_FILE} names for it: a damaged checkpoint?")
            tensor = np.asarray(f.get_tensor(name))
        if not jnp.issubdtype(tensor.dtype, jnp.floating):
            raise ValueError(f"tensor {name!r} is {tensor.dtype}, not floating point: quantized "
                             "checkpoints are not read")
        bad = tensor.size - int(np.isfinite(tensor).sum())
        if bad:
            raise ValueError(f"tensor {name!r} in {self.files[name].name} holds {bad} non-finite "
                             f"value(s) of {tensor.size}: a damaged checkpoint?")
        return tensor

    def _opened(self, path: Path):
        from safetensors import SafetensorError

        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (named by {INDEX_FILE})")
        try:
            return self._open(path, framework="flax")
        except SafetensorError as e:
            raise ValueError(f"{path} is not a readable safetensors file (damaged or cut "
                             f"short?): {e}") from None


def load_hf_model(directory: str | Path, config: ModelConfig, *, mesh: Mesh | None = None
                  ) -> LanguageModel:
    """A `LanguageModel` of `config` holding the weights of the HF checkpoint in `directory`.

    With `mesh`, every parameter is placed in its sharding as it is read (see the module
    docstring). Every tensor of the checkpoint must be used and every parameter found.
    """
    reader = SafetensorsDir(directory)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: LanguageModel(config,
                                                                     rngs=nnx.Rngs(0))))
    names, used = name_map(len(config.layers)), set()

    def load(path, variable):
        ours = leaf_name(path)
        if ours not in names:
            raise ValueError(f"parameter {ours} has no Hugging Face name: the import reads "
                             "all-attention (Llama-family) models only")
        hf, kind = names[ours]
        abstract = variable.get_value()
        try:
            array = to_ours(reader.get(hf), kind, abstract.shape).astype(abstract.dtype)
        except ValueError as e:
            raise ValueError(f"{directory}: tensor {hf} → {ours}: {e}") from None
        used.add(hf)
        if mesh is None:
            return variable.replace(jax.device_put(array))
        sharding = variable_sharding(variable, mesh)
        return variable.replace(jax.make_array_from_callback(array.shape, sharding,
                                                             lambda index: array[index]))

    state = jax.tree_util.tree_map_with_path(load, state,
                                             is_leaf=lambda v: isinstance(v, nnx.Variable))
    unused = [n for n in reader.names() if n not in used and not IGNORED.search(n)
              and not (config.tie_embeddings and n == "lm_head.weight")]
    if unused:
        raise ValueError(f"{directory}: {len(unused)} tensors are not part of the model "
                         f"(e.g. {unused[:3]}); is config.json the checkpoint's?")
    return nnx.merge(graphdef, state)


def hf_tensors(model: LanguageModel) -> dict[str, np.ndarray]:
    """The model's parameters under their Hugging Face names and layouts, on the host."""
    names, tensors = name_map(len(model.config.layers)), {}
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param),
                                                is_leaf=lambda v: isinstance(v, nnx.Variable))
    for path, variable in flat[0]:
        ours = leaf_name(path)
        if ours not in names:
            raise ValueError(f"parameter {ours} has no Hugging Face name: export writes "
                             "all-attention (Llama-family) models only")
        hf, kind = names[ours]
        tensors[hf] = to_hf(np.asarray(jax.device_get(variable.get_value())), kind)
    return tensors


def save_safetensors(tensors: dict[str, np.ndarray], directory: str | Path, *,
                     max_shard_bytes: int = 5 * 2**30) -> list[Path]:
    """Writes `tensors` as `model.safetensors`, or as shards plus `model.safetensors.index.json`
    when they exceed `max_shard_bytes` (Hugging Face's layout). Returns the files written."""
    import jax.numpy as jnp
    from safetensors.flax import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += tensors[name].nbytes
    files = ([directory / SINGLE_FILE] if len(shards) == 1 else
             [directory / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
              for i in range(len(shards))])
    with _host_device():
        for shard, path in zip(shards, files, strict=True):
            save_file({k: jnp.asarray(v) for k, v in shard.items()}, path,
                      metadata={"format": "pt"})
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                 "weight_map": {name: path.name for shard, path in zip(shards, files,
                                                                      strict=True)
                                for name in shard}}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return files
