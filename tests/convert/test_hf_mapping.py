"""Hugging Face import/export, piece by piece, against hand-written expectations: config.json
fields and their transformers defaults, refusals, the tensor layouts, what a checkpoint may
hold besides the model, the shard files and index that export writes."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.flax import load_file, save_file

from hybrid_jax.config import layer
from hybrid_jax.convert.hf import export_hf, import_hf
from hybrid_jax.convert.hf_config import hf_config_from_model, model_config_from_hf
from hybrid_jax.convert.hf_weights import (
    INDEX_FILE,
    SINGLE_FILE,
    SafetensorsDir,
    hf_tensors,
    load_hf_model,
    save_safetensors,
    to_hf,
    to_ours,
)
from hybrid_jax.nn.lm import create_model
from tests.convert.test_hf import FIXTURES, params

# A Llama config.json with only the keys transformers cannot default.
MINIMAL = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
           "num_hidden_layers": 2, "intermediate_size": 48, "vocab_size": 64}
# Mistral and Qwen2 default to 8 and 32 key/value heads, which 4 heads cannot share.
MHA = {"num_key_value_heads": None}


def fixture_config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


def windows(config):
    return [config.block_options(i).window for i in range(len(config.layers))]


def test_keys_left_out_take_transformers_defaults():
    """LlamaConfig's defaults: silu, MHA (kv heads = heads), head_dim = hidden/heads,
    rms_norm_eps 1e-6, rope_theta 10000, no scaling, untied, no window, no biases."""
    config = model_config_from_hf(MINIMAL)
    options = config.block_options(0)
    assert (options.num_heads, options.num_kv_heads, config.resolved_head_dim) == (4, 4, 8)
    assert config.norm_eps == 1e-6 and options.rope_theta == 10000.0
    assert options.rope_scaling is None and not options.qkv_bias
    assert not config.tie_embeddings and windows(config) == [None, None]
    assert (config.vocab_size, config.d_model, config.resolved_ffn_dim) == (64, 32, 48)


def test_head_dim_apart_from_hidden_over_heads():
    config = model_config_from_hf({**MINIMAL, "head_dim": 16, "num_key_value_heads": 2})
    assert (config.resolved_head_dim, config.kv_heads) == (16, 2)
    assert model_config_from_hf(hf_config_from_model(config)) == config  # export writes both
    assert model_config_from_hf({**MINIMAL, "head_dim": None}).resolved_head_dim == 8
    # A key left out is the model class's default (LlamaConfig's: one per query head).
    for kind, kv_heads in (("llama", 64), ("mistral", 8), ("qwen2", 32)):
        hf = {**MINIMAL, "model_type": kind, "num_attention_heads": 64, "head_dim": 1}
        assert model_config_from_hf(hf).kv_heads == kv_heads, kind


def test_legacy_rope_scaling_spelling():
    """Older config.json files: top-level rope_theta and rope_scaling with `type`."""
    hf = {**MINIMAL, "rope_theta": 500000.0,
          "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    options = model_config_from_hf(hf).block_options(0)
    assert options.rope_theta == 500000.0
    assert options.rope_scaling == (8.0, 1.0, 4.0, 8192.0)
    # Both spellings at once are read when they agree.
    both = {**hf, "rope_parameters": {**hf["rope_scaling"], "rope_theta": 500000}}
    assert model_config_from_hf(both) == model_config_from_hf(hf)
    # Exported in the same spelling, the position count an integer (as transformers checks).
    scaling = hf_config_from_model(model_config_from_hf(hf))["rope_scaling"]
    assert scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert type(scaling["original_max_position_embeddings"]) is int


@pytest.mark.parametrize("change,message", [
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(mlp_bias=True), "mlp_bias=True"),
    (dict(layer_types=["full_attention"]), r"layer_types=\['full_attention'\].*expected 2 of"),
    (dict(layer_types=["full_attention", "chunked_attention"]), "layer_types="),
    # transformers fails on these: no rope_type, or llama3 without all of its parameters
    (dict(rope_scaling={"factor": 8.0}), r"rope_scaling=\{'factor': 8.0\}.*a 'rope_type'"),
    (dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
     r"partial_rotary_factor=0.5 .*expected 1.0"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     r"every llama3 parameter \(missing \['low_freq_factor', 'high_freq_factor', "),
    # RoPE said twice, differently (transformers' precedence has changed between versions)
    (dict(rope_theta=1e4, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
     r"RoPE theta=\{'rope_theta': 10000.0, 'rope_parameters.rope_theta': 500000.0\}"),
    (dict(rope_scaling={"rope_type": "default"},
          rope_parameters={"rope_type": "llama3", "factor": 8.0}),
     r"rope_scaling=\{'rope_type': 'default'\} .*expected the same RoPE as its rope_param"),
    # Windows that transformers would not slide as the config says (LlamaForCausalLM has no
    # window, MistralConfig ignores layer_types, Qwen2Config slides only with
    # use_sliding_window): refused, neither followed nor ignored.
    (dict(sliding_window=4), "sliding_window=4 .*expected null for model_type 'llama'"),
    (dict(model_type="mistral", sliding_window=4,
          layer_types=["full_attention", "sliding_attention"]),
     r"expected the layers that mistral slides by its \{'sliding_window': 4\}: "
     r"\['sliding_attention', 'sliding_attention'\]"),
    (dict(model_type="qwen2", sliding_window=4,
          layer_types=["full_attention", "sliding_attention"]),
     r"qwen2 slides by its \{'use_sliding_window': None, 'sliding_window': 4\}: "
     r"\['full_attention', 'full_attention'\]"),
])
def test_config_refusals_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        model_config_from_hf({**MINIMAL, **change})


def test_layer_types_choose_each_layers_window():
    config = model_config_from_hf({**MINIMAL, **MHA, "model_type": "qwen2", "num_hidden_layers": 3,
                                   "sliding_window": 4, "use_sliding_window": True,
                                   "layer_types": ["sliding_attention", "full_attention",
                                                   "sliding_attention"]})
    assert windows(config) == [4, None, 4]
    # Layer types that agree with what the model class slides are accepted.
    assert windows(model_config_from_hf({**MINIMAL, "layer_types": ["full_attention"] * 2})
                   ) == [None, None]
    mistral = {**MINIMAL, **MHA, "model_type": "mistral", "sliding_window": 4}
    assert windows(model_config_from_hf({**mistral, "layer_types": ["sliding_attention"] * 2})
                   ) == [4, 4]


def test_qwen2_windows_as_transformers_reads_them():
    """Qwen2Config: use_sliding_window defaults to False (a sliding_window alone slides
    nothing) and max_window_layers to 28 (layers from 28 on slide)."""
    qwen = {**MINIMAL, **MHA, "model_type": "qwen2", "sliding_window": 4}
    assert windows(model_config_from_hf({**qwen, "max_window_layers": 0})) == [None, None]
    deep = model_config_from_hf({**qwen, "num_hidden_layers": 30, "use_sliding_window": True})
    assert windows(deep) == [None] * 28 + [4, 4]


def test_qwen2_export_says_its_windows_without_layer_types_too():
    """transformers before `layer_types` read Qwen2's windows from use_sliding_window and
    max_window_layers: the exported ones slide the same layers."""
    config = model_config_from_hf({**MINIMAL, **MHA, "model_type": "qwen2", "sliding_window": 4,
                                   "use_sliding_window": True, "max_window_layers": 0})
    hf = hf_config_from_model(config)
    del hf["layer_types"]
    assert windows(model_config_from_hf(hf)) == [4, 4]
    # Qwen2 always has q/k/v biases: a model without them is exported as Llama, whatever the
    # imported config.json's model_type (a Qwen2 config reads back as a model with biases).
    plain = config.replace(qkv_bias=False, window=None, layers=("attention",) * 2)
    hf = hf_config_from_model(plain, {"model_type": "qwen2"})
    assert hf["model_type"] == "llama" and model_config_from_hf(hf) == plain
    assert [hf_config_from_model(c)["architectures"] for c in (
        config, plain, config.replace(qkv_bias=False))] == [
        ["Qwen2ForCausalLM"], ["LlamaForCausalLM"], ["MistralForCausalLM"]]


def test_a_missing_sliding_window_is_transformers_default_and_null_is_full():
    """MistralConfig and Qwen2Config default `sliding_window` to 4096 when the key is absent;
    an explicit null is full attention. Llama has no such default."""
    mistral = {**MINIMAL, **MHA, "model_type": "mistral"}
    assert windows(model_config_from_hf(mistral)) == [4096, 4096]
    assert windows(model_config_from_hf({**mistral, "sliding_window": None})) == [None, None]
    qwen = {**MINIMAL, **MHA, "model_type": "qwen2", "use_sliding_window": True,
            "max_window_layers": 1}
    assert windows(model_config_from_hf(qwen)) == [None, 4096]
    assert windows(model_config_from_hf(MINIMAL)) == [None, None]


def test_export_writes_the_models_rope_over_the_imported_one():
    """The imported config.json (Llama-3 scaled `rope_parameters`, or the older top-level
    `rope_theta`) is the base; a model whose RoPE differs exports its own theta and no
    scaling, and reads back as itself."""
    base = fixture_config("llama")
    legacy = {**{k: v for k, v in base.items() if k != "rope_parameters"}, "rope_theta": 1e4}
    config = model_config_from_hf(base).replace(rope_theta=500000.0, rope_scaling=None)
    for old in (base, legacy):
        hf = hf_config_from_model(config, old)
        assert hf["rope_theta"] == 500000.0 and hf["rope_scaling"] is None
        assert "rope_parameters" not in hf
        assert model_config_from_hf(hf) == config


@pytest.mark.parametrize("layers,change,message", [
    (("attention", layer("attention", window=4)), {}, "one window for every layer"),
    ((layer("attention", window=8), layer("attention", window=4)), {},
     r"one sliding window size, found \[4, 8\]"),
    (("attention", layer("attention", num_kv_heads=1)), {}, "layers' num_kv_heads"),
    (("attention", layer("attention", qkv_bias=True)), {}, "layers' qkv_bias"),
    (("attention", layer("attention", rope_theta=500.0)), {}, "layers' rope_theta"),
    (("attention", layer("attention", cosine=True)), {}, r"layers\[1\].cosine=True"),
])
def test_export_refuses_layers_a_llama_config_cannot_hold(layers, change, message):
    config = model_config_from_hf(MINIMAL).replace(layers=layers, **change)
    with pytest.raises(ValueError, match=message):
        hf_config_from_model(config)


def test_tensor_layouts_by_hand():
    """torch Linear W[out, in] → our [in, heads, head_dim] ("in") and [heads, head_dim, out]
    ("out"); flat biases → [heads, head_dim]; and back."""
    w = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)  # out = 2 heads x 3, in = 4
    ours = to_ours(w, "in", (4, 2, 3))
    assert ours[1, 1, 2] == w[1 * 3 + 2, 1] and ours[3, 0, 1] == w[1, 3]
    o = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)  # out = 4, in = 2 heads x 3
    ours_o = to_ours(o, "out", (2, 3, 4))
    assert ours_o[1, 2, 3] == o[3, 1 * 3 + 2] and ours_o[0, 1, 2] == o[2, 1]
    np.testing.assert_array_equal(to_ours(np.arange(6.0), "vector", (2, 3))[1],
                                  [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(to_hf(ours, "in"), w)
    np.testing.assert_array_equal(to_hf(ours_o, "out"), o)
    with pytest.raises(ValueError, match=r"expected shape \(6, 4\).*found \(4, 6\)"):
        to_ours(w.T, "in", (4, 2, 3))  # same size, transposed: refused, not reshaped


def checkpoint(tmp_path, tie, **extra):
    """A tiny model of ours written as a Hugging Face checkpoint, plus `extra` tensors."""
    config = model_config_from_hf({**MINIMAL, "tie_word_embeddings": tie})
    model = create_model(config, seed=1)
    tensors = hf_tensors(model)
    save_file({k: jnp.asarray(v) for k, v in {**tensors, **extra}.items()},
              tmp_path / SINGLE_FILE)
    return config, model, tensors


def test_checkpoint_buffers_and_a_tied_head_are_ignored(tmp_path):
    """rotary_emb.inv_freq buffers are recomputed, and a tied model ignores a stored lm_head
    (some checkpoints keep the duplicate); the parameters load exactly."""
    inv_freq = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
    for tie in (True, False):
        directory = tmp_path / str(tie)
        directory.mkdir()
        head = {"lm_head.weight": np.zeros((64, 32), np.float32)} if tie else {}
        config, model, _ = checkpoint(directory, tie, **inv_freq, **head)
        loaded = params(load_hf_model(directory, config))
        for key, value in params(model).items():
            np.testing.assert_array_equal(loaded[key], value, err_msg=key)


def test_missing_or_wrongly_shaped_tensors_are_named(tmp_path):
    config, _, tensors = checkpoint(tmp_path, True)
    del tensors["model.layers.1.mlp.gate_proj.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.ascontiguousarray(
        tensors["model.layers.0.self_attn.k_proj.weight"].T)  # [32, 32]: same shape
    save_file({k: jnp.asarray(v) for k, v in tensors.items()}, tmp_path / SINGLE_FILE)
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.mlp.gate_proj.weight' not "
                                         "found"):
        load_hf_model(tmp_path, config)
    wrong = model_config_from_hf({**MINIMAL, "num_key_value_heads": 2})
    with pytest.raises(ValueError, match=r"k_proj.weight → blocks/0/mixer/k_proj/kernel: "
                                         r"expected shape \(16, 32\).*found \(32, 32\)"):
        load_hf_model(tmp_path, wrong)


def test_index_without_weight_map_is_refused(tmp_path):
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match="expected JSON with a 'weight_map'"):
        SafetensorsDir(tmp_path)


@pytest.mark.parametrize("value, message", [
    (np.arange(4, dtype=np.int32), r"tensor 'w' is int32, not floating point: quantized "
                                   r"checkpoints are not read"),
    (np.array([1.0, np.nan, np.inf, 2.0], np.float32),
     r"tensor 'w' in model.safetensors holds 2 non-finite value\(s\) of 4: a damaged"),
    (np.array([1.0, np.inf], jnp.bfloat16), r"holds 1 non-finite value\(s\) of 2"),
])
def test_tensors_that_are_not_finite_floats_are_refused(tmp_path, value, message):
    """A cast turned a quantized checkpoint's ints into noise; NaN weights loaded silently."""
    save_file({"w": jnp.asarray(value)}, tmp_path / SINGLE_FILE)
    with pytest.raises(ValueError, match=message):
        SafetensorsDir(tmp_path).get("w")


def test_unreadable_weight_files_are_named(tmp_path):
    save_file({"w": jnp.ones(64)}, tmp_path / SINGLE_FILE)
    data = (tmp_path / SINGLE_FILE).read_bytes()
    (tmp_path / SINGLE_FILE).write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=rf"{SINGLE_FILE} is not a readable safetensors file "
                                         r"\(damaged or cut short\?\)"):
        SafetensorsDir(tmp_path)
    (tmp_path / SINGLE_FILE).unlink()
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"w": "model-2.safetensors"}}))
    with pytest.raises(FileNotFoundError, match=rf"model-2.safetensors not found \(named by "
                                                rf"{INDEX_FILE}\)"):
        SafetensorsDir(tmp_path).get("w")
    save_file({"v": jnp.ones(4)}, tmp_path / "model-2.safetensors")
    with pytest.raises(ValueError, match=rf"tensor 'w' is not in model-2.safetensors, the file "
                                         rf"{INDEX_FILE} names for it"):
        SafetensorsDir(tmp_path).get("w")
    (tmp_path / INDEX_FILE).unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"found \['pytorch_model.bin'\]: PyTorch pickles "
                                                r"are not read; save the model as safetensors"):
        SafetensorsDir(tmp_path)


def test_parameters_take_the_configs_dtype():
    """The fixtures are stored in bfloat16: every parameter is cast to param_dtype."""
    for dtype in ("float32", "bfloat16"):
        config = model_config_from_hf(fixture_config("llama"), dtype=dtype)
        assert {v.dtype for v in params(load_hf_model(FIXTURES / "llama", config)).values()
                } == {np.dtype(dtype)}


def f32(n, value):
    return np.full(n, value, np.float32)


def test_shards_fill_up_to_the_limit_and_the_index_names_them(tmp_path):
    """Tensors in name order; a shard takes a tensor while it stays <= max_shard_bytes; files
    named model-0000i-of-0000n; the index maps names to bare file names with the byte total."""
    tensors = {"a": f32(4, 1), "b": f32(4, 2), "c": f32(4, 3), "d": f32(4, 4), "e": f32(8, 5)}
    files = save_safetensors(tensors, tmp_path, max_shard_bytes=32)
    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert [p.name for p in files] == names
    assert [sorted(load_file(p)) for p in files] == [["a", "b"], ["c", "d"], ["e"]]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == 96
    assert index["weight_map"] == {"a": names[0], "b": names[0], "c": names[1],
                                   "d": names[1], "e": names[2]}
    for path in files:  # transformers refuses safetensors files without this metadata
        with safe_open(path, "np") as f:
            assert f.metadata() == {"format": "pt"}
    reader = SafetensorsDir(tmp_path)
    for name, value in tensors.items():
        np.testing.assert_array_equal(reader.get(name), value)
    # One tensor over the limit: one file, no empty shard before it.
    single = tmp_path / "single"
    assert save_safetensors({"big": f32(16, 1)}, single, max_shard_bytes=32) == [
        single / SINGLE_FILE]
    assert not (single / INDEX_FILE).exists()


def copy_fixture(tmp_path, name, **config):
    directory = tmp_path / name
    shutil.copytree(FIXTURES / name, directory)
    (directory / "config.json").write_text(json.dumps({**fixture_config(name), **config}))
    return directory


def test_import_keeps_config_and_token_files_and_export_keeps_token_ids(tmp_path):
    """The run keeps config.json as hf_config.json and the tokenizer files; export writes the
    imported token ids back (BOS 1, EOS 2) with generation_config.json beside."""
    import_hf(FIXTURES / "llama", tmp_path / "run")
    run = tmp_path / "run"
    assert json.loads((run / "hf_config.json").read_text()) == fixture_config("llama")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (run / name).read_bytes() == (FIXTURES / "llama" / name).read_bytes(), name
    _, model = import_hf(FIXTURES / "llama", tmp_path / "again")
    export_hf(model, run, tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (hf["bos_token_id"], hf["eos_token_id"]) == (1, 2)
    assert (tmp_path / "hf" / "generation_config.json").read_bytes() == (
        FIXTURES / "llama" / "generation_config.json").read_bytes()


def test_import_refusals(tmp_path):
    small = copy_fixture(tmp_path, "llama", vocab_size=100)
    with pytest.raises(ValueError, match="tokenizer has 128 tokens, more than the model's "
                                         "vocab_size=100"):
        import_hf(small, tmp_path / "run")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        import_hf(bad, tmp_path / "run2")
