"""Hugging Face import/export against PyTorch's stored outputs (tests/fixtures/hf, made by
make_fixtures.py with transformers): logits, greedy continuations, round trips, sharded loads."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.config import MeshConfig
from hybrid_jax.convert.hf import export_hf, import_hf
from hybrid_jax.convert.hf_config import model_config_from_hf
from hybrid_jax.convert.hf_weights import load_hf_model
from hybrid_jax.data.tokenizer import load_tokenizer
from hybrid_jax.generate import generate
from hybrid_jax.sharding import make_mesh

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
MODELS = ("llama", "qwen2", "mistral")


def load(name, **kw):
    config = model_config_from_hf(json.loads((FIXTURES / name / "config.json").read_text()))
    return load_hf_model(FIXTURES / name, config, **kw), np.load(FIXTURES / name /
                                                                 "reference.npz")


def padded_prompts(tokenizer, prompts):
    ids = [tokenizer.encode_prompt(str(p)) for p in prompts]
    batch = np.zeros((len(ids), max(map(len, ids))), np.int32)
    for row, x in enumerate(ids):
        batch[row, :len(x)] = x
    return batch, [len(x) for x in ids]


def params(model):
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in
            jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]}


@pytest.mark.parametrize("name", MODELS)
def test_logits_equal_pytorch(name):
    model, ref = load(name)
    logits = np.asarray(model(ref["ids"]))
    err = np.abs(logits - ref["logits"]).max() / np.abs(ref["logits"]).max()
    assert err <= 1e-4, err


def test_config_features():
    llama, qwen, mistral = (model_config_from_hf(json.loads((FIXTURES / n / "config.json")
                                                            .read_text())) for n in MODELS)
    assert llama.rope_scaling == (4.0, 0.5, 4.0, 32.0) and not llama.tie_embeddings
    assert qwen.qkv_bias and qwen.tie_embeddings and qwen.rope_theta == 1000.0
    assert mistral.window == 4 and (llama.num_kv_heads, llama.num_heads) == (2, 4)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_ragged_batch_equals_pytorch(name):
    model, ref = load(name)
    tokenizer = load_tokenizer(FIXTURES / name / "tokenizer.json")
    batch, lengths = padded_prompts(tokenizer, ref["prompts"])
    assert len(set(lengths)) == 2  # prompts of different lengths in one batch
    out = generate(model, batch, ref["greedy"].shape[1], lengths=lengths)
    np.testing.assert_array_equal(np.asarray(out), ref["greedy"])


def test_sharded_load_places_params_on_mesh():
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    model, ref = load("qwen2", mesh=mesh)  # qwen2 is stored as 3 safetensors shards
    kernel = model.blocks[0].ffn.up.kernel[...]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert len({s.device for s in kernel.addressable_shards}) == 8
    err = np.abs(np.asarray(model(ref["ids"])) - ref["logits"]).max()
    assert err <= 1e-4 * np.abs(ref["logits"]).max()


@pytest.mark.parametrize("name,dtype", [("llama", "float32"), ("qwen2", "bfloat16")])
def test_export_reimport_is_exact(tmp_path, name, dtype):
    _, model = import_hf(FIXTURES / name, tmp_path / "run", dtype=dtype)
    export_hf(model, tmp_path / "run", tmp_path / "hf", max_shard_bytes=20_000)
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()  # sharded
    _, again = import_hf(tmp_path / "hf", tmp_path / "run2", dtype=dtype)
    assert again.config == model.config
    before, after = params(model), params(again)
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert model_config_from_hf(exported, dtype=dtype) == model.config
    assert exported["dtype"] == dtype  # the parameters' dtype (transformers' dtype="auto")


def test_config_defaults_and_windows_as_transformers_reads_them():
    """Keys a config.json may leave out take the model classes' defaults (Llama, Qwen2 and
    Mistral untie the head); a Qwen2 config without `layer_types` slides its window on the
    layers from `max_window_layers` on (transformers' Qwen2Config)."""
    for name in MODELS:
        hf = json.loads((FIXTURES / name / "config.json").read_text())
        hf.pop("tie_word_embeddings")
        assert not model_config_from_hf(hf).tie_embeddings, name
    qwen = json.loads((FIXTURES / "qwen2" / "config.json").read_text())
    qwen.pop("layer_types")
    qwen.update(num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                max_window_layers=1)
    windows = [model_config_from_hf(qwen).block_options(i).window for i in range(3)]
    assert windows == [None, 4, 4]
    assert [model_config_from_hf({**qwen, "use_sliding_window": False}).block_options(i).window
            for i in range(3)] == [None] * 3


def test_training_text_gets_no_special_tokens_and_prompts_get_the_template():
    """A Llama tokenizer's BOS starts a generation prompt (as transformers encodes it) but is
    not inserted into training text, piece by piece (`encode`, `encode_batch`)."""
    tokenizer = load_tokenizer(FIXTURES / "llama" / "tokenizer.json")
    plain = tokenizer.encode("hello world").tolist()
    assert tokenizer.encode_batch(["hello world"])[0].tolist() == plain
    assert tokenizer.encode_prompt("hello world").tolist() == [1] + plain  # <s>


def test_tensors_the_model_does_not_use_are_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(FIXTURES / "llama" / "model.safetensors")
    tensors["model.layers.2.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    config = model_config_from_hf(json.loads((FIXTURES / "llama" / "config.json").read_text()))
    with pytest.raises(ValueError, match=r"1 tensors are not part of the model.*layers\.2"):
        load_hf_model(tmp_path, config)


def test_import_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="Hugging Face model directory"):
        import_hf(tmp_path, tmp_path / "run")
    hf = json.loads((FIXTURES / "llama" / "config.json").read_text())
    for key, value, message in (("model_type", "gpt2", "model_type"),
                                ("hidden_act", "gelu", "hidden_act"),
                                ("rope_parameters", {"rope_type": "yarn"}, "rope type")):
        with pytest.raises(ValueError, match=message):
            model_config_from_hf({**hf, key: value})
    wrong = model_config_from_hf({**hf, "intermediate_size": 40})
    with pytest.raises(ValueError, match=r"down_proj.*expected shape \(32, 40\)"):
        load_hf_model(FIXTURES / "llama", wrong)


def copy_tokenizer(tmp_path, special_eos=True, **beside):
    """The llama fixture's tokenizer.json alone in `tmp_path`, plus JSON files `beside`."""
    data = json.loads((FIXTURES / "llama" / "tokenizer.json").read_text())
    for token in data["added_tokens"]:
        token["special"] = token["special"] and (special_eos or token["content"] != "</s>")
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    for name, content in beside.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    return tmp_path / "tokenizer.json"


def test_eos_of_other_spellings_beside_the_tokenizer(tmp_path):
    """`eos_token` given as an added-token object; an `eos_token_id` of `true` is no id, and a
    JSON file beside that holds no object is ignored (both fall back to the special `</s>`);
    two special tokens spelled as an EOS are refused, not guessed between."""
    config = {"eos_token": {"content": "</s>", "special": True}}
    assert load_tokenizer(copy_tokenizer(tmp_path, tokenizer_config=config)).eos_id == 2
    (tmp_path / "tokenizer_config.json").unlink()
    assert load_tokenizer(copy_tokenizer(tmp_path, config={"eos_token_id": True})).eos_id == 2
    (tmp_path / "config.json").unlink()
    assert load_tokenizer(copy_tokenizer(tmp_path, generation_config=[1])).eos_id == 2
    path = copy_tokenizer(tmp_path)
    data = json.loads(path.read_text())
    data["added_tokens"][1]["content"] = "<eos>"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"hold several of"):
        load_tokenizer(path)


def test_eos_without_tokenizer_config(tmp_path, caplog):
    # An eos_token_id in config.json (or generation_config.json) names the EOS ...
    assert load_tokenizer(copy_tokenizer(tmp_path, config={"eos_token_id": [1, 2]})).eos_id == 1
    (tmp_path / "config.json").unlink()
    # ... else the one special token spelled as an EOS, with a warning ...
    with caplog.at_level("WARNING"):
        assert load_tokenizer(copy_tokenizer(tmp_path)).eos_id == 2
    assert "'</s>'" in caplog.text and "tokenizer_config.json" in caplog.text
    # ... and none of them: an error, no guess.
    with pytest.raises(ValueError, match=r"cannot tell its end-of-sequence token.*'<s>', "
                                         r"'<unk>'\] hold none"):
        load_tokenizer(copy_tokenizer(tmp_path, special_eos=False))


def test_export_refuses_what_llama_cannot_express():
    from hybrid_jax.convert.hf_config import hf_config_from_model
    from hybrid_jax.convert.nha import nha_config

    config = model_config_from_hf(json.loads((FIXTURES / "llama" / "config.json").read_text()))
    hybrid = nha_config(config, window=4, num_slots=4, layers=[1])
    with pytest.raises(ValueError, match=r"every layer is an 'attention' block.*found 'nha' at "
                                         r"layers \[1\]"):
        hf_config_from_model(hybrid)
    for change, message in ((dict(rope_fraction=0.5), r"layers\[0\].rope_fraction=0.5"),
                            (dict(position_embedding="learned", max_positions=64),
                             "position_embedding='learned'"),
                            (dict(ffn_dim=0), "ffn_dim=0")):
        with pytest.raises(ValueError, match=message):
            hf_config_from_model(config.replace(**change))


def test_export_of_a_model_trained_here_names_its_eos(tmp_path):
    """A run of ours (no imported config.json, our BPE) exports with eos_token_id and a
    tokenizer_config.json naming its EOS."""
    from hybrid_jax.data.tokenizer import train_bpe
    from hybrid_jax.nn.lm import create_model

    tokenizer = train_bpe(["the cat sat on the mat. " * 20], 300)
    run = tmp_path / "run"
    tokenizer.save(run / "tokenizer.json")
    config = model_config_from_hf(json.loads((FIXTURES / "llama" / "config.json").read_text())
                                  ).replace(vocab_size=320)
    export_hf(create_model(config, seed=0), run, tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf["eos_token_id"] == tokenizer.eos_id and hf["bos_token_id"] is None
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())[
        "eos_token"] == "<|endoftext|>"
    assert load_tokenizer(tmp_path / "hf" / "tokenizer.json").eos_id == tokenizer.eos_id


def test_export_completes_the_eos_only_tokenizer_config_a_run_records(tmp_path):
    """A run whose tokenizer took its EOS from a tokenizer_config.json records one naming only
    `eos_token` (`HFTokenizer.save`); the export still names the class transformers loads, and
    keeps the run's EOS (it copied the bare file: no `tokenizer_class`)."""
    from hybrid_jax.nn.lm import create_model

    source = copy_tokenizer(tmp_path, special_eos=False, tokenizer_config={"eos_token": "</s>"})
    run = tmp_path / "run"
    load_tokenizer(source).save(run / "tokenizer.json")
    assert json.loads((run / "tokenizer_config.json").read_text()) == {"eos_token": "</s>"}
    config = model_config_from_hf(json.loads((FIXTURES / "llama" / "config.json").read_text()))
    export_hf(create_model(config, seed=0), run, tmp_path / "hf")
    exported = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert exported["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert exported["eos_token"] == "</s>" and exported["bos_token"] is None
    assert load_tokenizer(tmp_path / "hf" / "tokenizer.json").eos_id == 2


def test_export_refuses_a_directory_that_holds_files(tmp_path):
    """Exporting over another model's folder (e.g. the imported checkpoint's, with its shards
    and index) left its files mixed with ours; an empty or new folder is fine."""
    model, _ = load("llama")
    (tmp_path / "empty").mkdir()
    assert export_hf(model, FIXTURES / "llama", tmp_path / "empty") == tmp_path / "empty"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.safetensors.index.json").write_text("{}")
    (tmp_path / "a-file").write_text("")
    for out, found in [("empty", "'config.json', 'generation_config.json'"),
                       ("old", "'model.safetensors.index.json'"), ("a-file", "a file")]:
        with pytest.raises(ValueError, match=rf"export: {tmp_path / out} is not an empty "
                                             rf"directory \(it holds \[?{found}"):
            export_hf(model, FIXTURES / "llama", tmp_path / out)
    assert (tmp_path / "old" / "model.safetensors.index.json").read_text() == "{}"


def test_a_failed_export_leaves_no_half_written_directory(tmp_path, monkeypatch):
    """An export that fails after its shards are written (here: copying the tokenizer) removes
    them, so `out` is as before (absent, or empty) and a retry is not refused."""
    import hybrid_jax.convert.hf as hf

    model, _ = load("llama")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(hf.shutil, "copyfile", fail)
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty"):
        with pytest.raises(OSError, match="disk full"):
            export_hf(model, FIXTURES / "llama", out, max_shard_bytes=20_000)
    assert not (tmp_path / "new").exists() and not any((tmp_path / "empty").iterdir())
    monkeypatch.undo()
    export_hf(model, FIXTURES / "llama", tmp_path / "new")
    assert (tmp_path / "new" / "tokenizer.json").is_file()


def test_export_of_scanned_layers_is_per_layer(tmp_path):
    model, _ = load("llama")
    export_hf(model.with_scan_layers(True), FIXTURES / "llama", tmp_path / "hf")
    again = load_hf_model(tmp_path / "hf", model.config)
    before, after = params(model), params(again)
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before)
