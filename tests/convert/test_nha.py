"""Conversion of an imported transformer into NHA: with W ≥ T it is the same model."""

import numpy as np
import pytest
from flax import nnx

from hybrid_jax.convert.nha import NEW_PARAMETER, convert_to_nha
from tests.convert.test_hf import load


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
