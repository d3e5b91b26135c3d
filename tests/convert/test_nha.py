"""Conversion of an imported transformer into NHA: with W ≥ T it is the same model."""

import numpy as np
import pytest
from flax import nnx

from hybrid_jax import presets
from hybrid_jax.convert.nha import NEW_PARAMETER, convert_to_nha, nha_config
from hybrid_jax.convert.oryx import oryx_config
from hybrid_jax.convert.params import named_values, transplant
from tests.convert.test_hf import load
from tests.convert.test_oryx import two_attention_layers


def decode_all(model, ids, split):
    cache = model.init_cache(ids.shape[0], ids.shape[1])
    logits, cache = model.decode(ids[:, :split], cache)
    steps = [logits]
    for t in range(split, ids.shape[1]):
        logits, cache = model.decode(ids[:, t:t + 1], cache)
        steps.append(logits)
    return np.concatenate([np.asarray(s) for s in steps], axis=1)


@pytest.mark.parametrize("name,window", [("qwen2", None), ("llama", 12)])
def test_full_window_nha_equals_original(name, window):
    model, ref = load(name)
    ids = ref["ids"]  # [2, 12]
    original = np.asarray(model(ids))
    converted = convert_to_nha(model, window=window, num_slots=4)
    assert {spec.type for spec in converted.config.layers} == {"nha"}
    scale = np.abs(original).max()
    assert np.abs(np.asarray(converted(ids)) - original).max() <= 1e-5 * scale
    assert np.abs(decode_all(converted, ids, 5) - original).max() <= 1e-5 * scale


def test_small_window_differs_and_only_slot_gates_are_new():
    model, ref = load("llama")
    converted = convert_to_nha(model, window=4, num_slots=4, layers=[1])
    assert [spec.type for spec in converted.config.layers] == ["attention", "nha"]
    old = nnx.to_flat_state(nnx.state(model, nnx.Param))
    new = nnx.to_flat_state(nnx.state(converted, nnx.Param))
    added = {"/".join(map(str, p)) for p, _ in new} - {"/".join(map(str, p)) for p, _ in old}
    assert added == {f"blocks/1/{NEW_PARAMETER}"}
    assert np.abs(np.asarray(converted(ref["ids"])) - np.asarray(model(ref["ids"]))).max() > 1e-2


def test_convert_refuses_non_attention_layers():
    model, _ = load("llama")
    with pytest.raises(ValueError, match="layer 5 is not an attention layer"):
        convert_to_nha(model, window=4, num_slots=4, layers=[5])


def test_seed_draws_the_slot_gates_and_nothing_else():
    """`seed` draws the new W_f (the same seed, the same W_f; another seed, another W_f) and
    every transplanted parameter is the original's whatever the seed."""
    model, _ = load("llama")
    values = named_values(model)
    gates = {}
    for seed in (0, 0, 1):
        converted = named_values(convert_to_nha(model, window=4, num_slots=4, seed=seed))
        assert all(np.array_equal(converted[k], v) for k, v in values.items())
        gates.setdefault(seed, []).append(np.asarray(converted[f"blocks/0/{NEW_PARAMETER}"]))
    np.testing.assert_array_equal(*gates[0])
    assert not np.allclose(gates[0][0], gates[1][0])


def test_transplant_refuses_parameters_left_out_or_unknown():
    """Every variable of the new model is given or new, and every given value lands somewhere:
    a conversion that forgot a parameter, or one whose name no longer matches, is an error,
    not a freshly initialised or silently dropped weight."""
    model, _ = load("llama")
    values = named_values(model)
    with pytest.raises(ValueError, match="left out: \\['blocks/0/mixer/bogus/kernel'\\]"):
        transplant(model.config, {**values, "blocks/0/mixer/bogus/kernel": values[
            "blocks/0/mixer/q_proj/kernel"]}, lambda name, value: None)
    del values["blocks/1/mixer/q_proj/kernel"]
    with pytest.raises(ValueError, match="blocks/1/mixer/q_proj/kernel is neither in the "):
        transplant(model.config, values, lambda name, value: None)


# Layer 0's own attention options, all unlike the model-level defaults (which the fixtures'
# layers use, so a converter that dropped one would still match them).
OWN_OPTIONS = dict(num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=500.0,
                   rope_fraction=0.5, rope_scaling=(8.0, 1.0, 4.0, 64.0), qkv_bias=True)


def test_nha_layers_keep_their_attention_layers_own_options():
    """Each NHA layer takes its attention layer's heads, head size, RoPE and q/k/v biases,
    layer 0's own values included."""
    config = two_attention_layers(**OWN_OPTIONS)
    converted = nha_config(config, window=8, num_slots=2)
    assert [spec.type for spec in converted.layers] == ["nha", "nha"]
    for i in (0, 1):  # (named here, not by SHARED_OPTIONS, which a bug could shorten)
        before, after = config.block_options(i), converted.block_options(i)
        assert {n: getattr(after, n) for n in OWN_OPTIONS} == {
            n: getattr(before, n) for n in OWN_OPTIONS}
    assert {n: getattr(converted.block_options(0), n) for n in OWN_OPTIONS} == OWN_OPTIONS


def test_a_layers_own_sliding_window_is_kept_unless_a_window_is_given():
    """Mistral-style windowed layers keep their window as the NHA window (the CLI's default);
    full-attention layers take the given one; `own_windows=False` sets every layer's."""
    config = two_attention_layers(window=6)

    def windows(**options):
        converted = nha_config(config, window=8, num_slots=2, **options)
        return [converted.block_options(i).window for i in (0, 1)]

    assert windows(own_windows=True) == [6, 8]
    assert windows() == [8, 8]


def test_convert_refuses_cosine_attention():
    with pytest.raises(ValueError, match="layer 0 uses cosine attention"):
        nha_config(two_attention_layers(**OWN_OPTIONS, cosine=True), window=8, num_slots=2)


@pytest.mark.parametrize("to", [
    lambda config, layers: nha_config(config, window=4, num_slots=4, layers=layers),
    oryx_config,
], ids=["nha", "oryx"])
@pytest.mark.parametrize("preset, layers, message", [
    ("gdn-tiny", None, r"no attention layer \(its layers: \['gdn', 'gdn'\]\)"),
    ("transformer-tiny", [], "the chosen layers are empty"),
])
def test_convert_refuses_a_choice_of_no_layers(to, preset, layers, message):
    """A conversion that would change nothing (a model without attention, or an empty list)
    is refused instead of writing a copy of the run as a converted one."""
    with pytest.raises(ValueError, match=f"convert: no layer to convert: .*{message}"):
        to(presets.get(preset), layers)


@pytest.mark.parametrize("to", ["nha", "oryx"])
def test_a_scanned_model_converts_as_its_layers_one_by_one(to):
    """A model with stacked layers (`scan_layers`, as `import hf --scan-layers` loads it)
    converts like its unstacked form, some layers only included, and stays stacked: its
    stacked names are not per layer (a KeyError for Oryx, a "neither in the original model"
    error for NHA)."""
    from hybrid_jax.convert.oryx import convert_to_oryx
    from hybrid_jax.nn.lm import create_model

    model = create_model(presets.get("transformer-tiny").replace(
        vocab_size=32, d_model=16, ffn_dim=32, scan_layers=True))
    ids = np.arange(12).reshape(2, 6)
    converted = (convert_to_nha(model, window=None, num_slots=2, layers=[1]) if to == "nha"
                 else convert_to_oryx(model, layers=[1]))
    assert converted.config.scan_layers
    assert [spec.type for spec in converted.config.layers] == ["attention", to]
    np.testing.assert_allclose(np.asarray(converted(ids)), np.asarray(model(ids)), atol=1e-5)
