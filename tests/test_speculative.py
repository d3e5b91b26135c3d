"""Self-speculative decoding: the roll-back restores the caches of a shorter call exactly, and
greedy speculative generation equals attention-mode greedy generation token for token."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.data.tokenizer import WordTokenizer
from hybrid_jax.generate import _generate, generate
from hybrid_jax.nn.oryx import MODE
from hybrid_jax.speculative import accepted_drafts, draft_and_verify, rollback
from tests.helpers import assert_close, shared_model

LAYERS = {"gdn": layer("oryx", chunk_size=4),
          "mamba2": layer("oryx", linear_mixer="mamba2", ssm_head_dim=4, state_size=8,
                          n_groups=2, chunk_size=4)}


def model_of(kind):
    """Oryx, full attention, Oryx: every kind of layer the roll-back handles (a fresh module
    per call, initialised once per kind)."""
    config = ModelConfig(layers=(LAYERS[kind], "attention", LAYERS[kind]), vocab_size=32,
                         d_model=16, num_heads=2, init_std=0.1)
    return shared_model(config, seed=1)


def attention_modes(shape):
    return {MODE: jnp.ones(shape, jnp.int32)}


@functools.partial(nnx.jit, static_argnames="record_steps")
def decode(model, tokens, cache, record_steps=False):
    """`model.decode` in attention mode, compiled (one program per call shape, not one per
    op)."""
    return model.decode(tokens, cache, extras=attention_modes(tokens.shape),
                        record_steps=record_steps)


jit_rollback = jax.jit(rollback, static_argnums=1)


@pytest.mark.parametrize("kind", list(LAYERS))
def test_rollback_equals_decoding_only_the_kept_tokens(kind):
    """A recorded call of 5 tokens rolled back to `keep` gives the caches (linear states,
    convs, KV positions) and next-token logits of a call of the first `keep` tokens."""
    model = model_of(kind)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 9)), jnp.int32)
    _, cache = decode(model, tokens[:, :3], model.init_cache(2, 12))
    _, recorded = decode(model, tokens[:, 3:8], cache, record_steps=True)
    for keep in (1, 3, 5):
        rolled = jit_rollback(recorded, 5, jnp.int32(keep))
        _, direct = decode(model, tokens[:, 3:3 + keep], cache)
        assert int(rolled.index) == 3 + keep
        oryx_rolled, oryx_direct = rolled.layers[0].branches[0], direct.layers[0].branches[0]
        assert_close(oryx_rolled.linear, oryx_direct.linear, 1e-6, f"linear keep={keep}")
        for layer_index, branch in ((0, 0), (1, 0)):
            kv = rolled.layers[layer_index].branches[branch]
            positions = (kv.attention if hasattr(kv, "attention") else kv).positions
            assert (np.asarray(positions) >= 0).sum() == 3 + keep
        nxt = tokens[:, 3 + keep:4 + keep]
        logits_rolled, _ = decode(model, nxt, rolled)
        logits_direct, _ = decode(model, nxt, direct)
        assert_close(logits_rolled, logits_direct, 1e-5, f"next logits keep={keep}")


@pytest.mark.parametrize("kind, ks, eos", [("gdn", (2, 5), True), ("mamba2", (1, 4), False)])
def test_greedy_speculative_equals_attention_mode_greedy(kind, ks, eos):
    """Random prompts of different lengths (batch 3, so rows still in their prompt and rows
    generating share rounds), several k; an end-of-sequence id cuts rows the same way."""
    model = model_of(kind)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, 32, (3, 7)).astype(np.int32)
    lengths = np.array([7, 3, 5])
    want = np.asarray(generate(model, prompt, 14, lengths=lengths, modes="attention"))
    for k in ks:
        stats = {}
        got = np.asarray(generate(model, prompt, 14, lengths=lengths, speculative=k,
                                  stats=stats))
        assert (got == want).all(), (k, got, want)
        assert 0 <= stats["acceptance_rate"] <= 1 and 1 <= stats["tokens_per_round"] <= k + 1
        # the rounds' kept tokens cover the positions from the common prefix (3) to the end
        assert stats["rounds"] * stats["tokens_per_round"] >= 7 + 14 - 3 - 1e-9, stats
    if eos:
        eos_id = int(want[1, 4])
        assert (np.asarray(generate(model, prompt, 14, lengths=lengths, speculative=3,
                                    eos_id=eos_id))
                == np.asarray(generate(model, prompt, 14, lengths=lengths, modes="attention",
                                       eos_id=eos_id))).all()


def test_speculative_prefill_is_in_attention_mode_whatever_the_default_mode():
    """Oryx layers whose `default_mode` is linear: the prefill (which passes no mode array)
    ran in linear mode, so the first generated token was the linear mode's, not attention's."""
    model = shared_model(ModelConfig(layers=(layer("oryx", chunk_size=4, default_mode="linear"),),
                                     vocab_size=32, d_model=16, num_heads=2, init_std=0.1))
    prompt = np.random.default_rng(4).integers(0, 32, (2, 5)).astype(np.int32)
    want = np.asarray(model(jnp.asarray(prompt), extras=attention_modes(prompt.shape)))
    got = np.asarray(generate(model, prompt, 1, speculative=1))
    assert (got[:, 0] == want[:, -1].argmax(-1)).all(), (got, want[:, -1].argmax(-1))


def test_generate_text_decodes_speculatively():
    """`generate_text(..., speculative=k)` gives the attention-mode texts and reports the
    statistics (None without speculative decoding)."""
    tokenizer = WordTokenizer(["<eos>", "<unk>"] + [f"w{i}" for i in range(2, 32)])
    prompts = ["w5 w9 w12 w3", "w7"]
    text = functools.partial(hj.generate_text, model_of("gdn"), tokenizer, prompts,
                             max_new_tokens=6)
    fast, plain = text(speculative=2), text(modes="attention")
    assert fast.texts == plain.texts and plain.speculative is None
    assert fast.speculative["rounds"] >= 1 and 0 <= fast.speculative["acceptance_rate"] <= 1


def round_after_prefill(model, prompt, lengths, k, prefix=3):
    """One round (`draft_and_verify`, k drafts) at position `prefix`, after an attention-mode
    prefill of the prompt's first `prefix` tokens; the round's token is the row's prompt token
    there, else the prefill's greedy one (as `generate` feeds it). Returns the block, the
    verified tokens, their logits and the accepted drafts, as numpy."""
    batch = prompt.shape[0]
    padded = jnp.pad(prompt, ((0, 0), (0, k + 1)))  # the round reads up to prefix + k + 1
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state):
        model = nnx.merge(graphdef, state)
        logits, cache = model.decode(prompt[:, :prefix], model.init_cache(batch, 16),
                                     extras=attention_modes((batch, prefix)))
        greedy = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        next_B = jnp.where(prefix < lengths, padded[:, prefix], greedy)
        block, targets, logits, _ = draft_and_verify(model, cache, padded, lengths,
                                                     jnp.int32(prefix), next_B, k)
        return block, targets, logits, accepted_drafts(block, targets)

    return (np.asarray(x) for x in run(state))


def test_rows_accept_different_numbers_of_drafts():
    """The setting above exercises lockstep acceptance: after a common prefill, the first
    round's accepted drafts differ between rows."""
    prompt = jnp.asarray(np.random.default_rng(4).integers(0, 32, (3, 3)), jnp.int32)
    *_, accepted = round_after_prefill(model_of("mamba2"), prompt, jnp.full((3,), 3), 5)
    assert len(set(accepted.tolist())) > 1, accepted


def test_drafts_inside_a_prompt_are_its_tokens():
    """A row still inside its prompt drafts the prompt's tokens, not the linear mode's guesses,
    and its verified tokens are the prompt's too, so it accepts every draft; a row whose prompt
    ends inside the round drafts its prompt up to the end (the output alone cannot show this:
    the verification would correct a wrong draft, at the cost of the round)."""
    prompt = jnp.asarray(np.random.default_rng(5).integers(0, 32, (2, 12)), jnp.int32)
    k = 5
    block, targets, logits, accepted = round_after_prefill(model_of("gdn"), prompt,
                                                           jnp.asarray([12, 6]), k)
    tokens = np.asarray(prompt)
    np.testing.assert_array_equal(block[0], tokens[0, 3:9])
    np.testing.assert_array_equal(targets[0, :k], tokens[0, 4:9])
    assert accepted[0] == k
    np.testing.assert_array_equal(block[1, :3], tokens[1, 3:6])  # positions 3, 4, 5 < 6
    np.testing.assert_array_equal(targets[1, :2], tokens[1, 4:6])
    # from position 6 on, row 1 is generated: the verified tokens are attention-mode greedy
    np.testing.assert_array_equal(targets[1, 2:], logits[1, 2:].argmax(-1))
    # (the prompt array's columns past row 1's length, which it must not read, differ)
    assert (targets[1, 2:] != tokens[1, 6:10]).any()
    assert accepted[1] >= 2


def test_statistics_leave_out_rows_already_done(monkeypatch):
    """Acceptances forced to 2 (row 0) and 1 (row 1, whose first token is the EOS): round 1
    keeps n + 1 = 2 tokens and counts both rows; then row 1 is done, so it neither holds the
    lockstep back (rounds of 3) nor counts as drafted or accepted: 7 of 8, in 3 rounds."""
    model = model_of("gdn")
    prompt = np.random.default_rng(1).integers(0, 32, (2, 3)).astype(np.int32)
    eos_id = int(np.asarray(generate(model, prompt, 1, speculative=2))[1, 0])
    monkeypatch.setattr("hybrid_jax.generate.accepted_drafts",
                        lambda block, targets: jnp.asarray([2, 1], jnp.int32))
    _generate.clear_cache()  # trace the forced acceptances (and drop them afterwards)
    stats = {}
    try:
        out = np.asarray(generate(model, prompt, 7, speculative=2, eos_id=eos_id, stats=stats))
    finally:
        _generate.clear_cache()
    assert (out[1] == eos_id).all() and eos_id not in out[0], out
    assert stats == {"rounds": 3, "acceptance_rate": 7 / 8, "tokens_per_round": 8 / 3}


def test_statistics_leave_out_rows_inside_their_prompt(monkeypatch):
    """Prompts of 3 and 5 tokens, acceptances forced to 2 and 1 (n = 1, two tokens a round):
    in round 1 (position 3) row 1 verifies its own prompt, not drafts, so only row 0 counts;
    rounds 2 and 3 count both rows and then row 1 alone: 6 of 8 accepted, not 7 of 10."""
    model = model_of("gdn")
    prompt = np.random.default_rng(2).integers(0, 32, (2, 5)).astype(np.int32)
    monkeypatch.setattr("hybrid_jax.generate.accepted_drafts",
                        lambda block, targets: jnp.asarray([2, 1], jnp.int32))
    _generate.clear_cache()
    stats = {}
    try:
        generate(model, prompt, 4, lengths=np.asarray([3, 5]), speculative=2, stats=stats)
    finally:
        _generate.clear_cache()
    assert stats == {"rounds": 3, "acceptance_rate": 6 / 8, "tokens_per_round": 2.0}


def test_accepted_drafts_counts_the_leading_matches():
    block = jnp.asarray([[9, 1, 2, 3], [9, 1, 5, 3], [9, 4, 2, 3]])
    targets = jnp.asarray([[1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 7]])
    assert accepted_drafts(block, targets).tolist() == [3, 1, 0]


def test_bad_requests_are_refused():
    model = model_of("gdn")
    prompt = np.zeros((1, 3), np.int32)
    with pytest.raises(ValueError, match="greedy"):
        generate(model, prompt, 4, speculative=2, temperature=0.5)
    with pytest.raises(ValueError, match="sets the modes itself"):
        generate(model, prompt, 4, speculative=2, modes="attention")
    with pytest.raises(ValueError, match=r"takes no extras .* got extras \['bias'\]"):
        generate(model, prompt, 4, speculative=2, extras={"bias": jnp.zeros((1, 7))})
    with pytest.raises(ValueError, match="speculative must be an integer >= 1"):
        generate(model, prompt, 4, speculative=0)
    plain = hj.create_model(ModelConfig(layers=("attention",), vocab_size=32, d_model=16,
                                        num_heads=2))
    with pytest.raises(ValueError, match="no Oryx layer"):
        generate(plain, prompt, 4, speculative=2)
    gdn = hj.create_model(ModelConfig(layers=(LAYERS["gdn"], "gdn"), vocab_size=32, d_model=16,
                                      num_heads=2))
    with pytest.raises(ValueError, match=r"layer 1 \(gdn\) keeps a GatedDeltaNetCache"):
        generate(gdn, prompt, 4, speculative=2)
    learned = hj.create_model(ModelConfig(layers=(LAYERS["gdn"],), vocab_size=32, d_model=16,
                                          num_heads=2, position_embedding="learned",
                                          max_positions=8))
    with pytest.raises(ValueError, match=r"speculative decoding: prompt \+ new tokens \+ 2 "
                                         r"drafts = 10 positions, more than the learned "
                                         r"position table's 8"):
        generate(learned, prompt, 5, speculative=2)  # 3 + 5 fit the table, the drafts do not
    # prompt 3 + 4 new + 2 drafts = 9 positions: a window of 8 would wrap around
    windowed = hj.create_model(ModelConfig(layers=(LAYERS["gdn"], layer("attention", window=8)),
                                           vocab_size=32, d_model=16, num_heads=2))
    with pytest.raises(ValueError, match="layer 1 is sliding-window attention"):
        generate(windowed, prompt, 4, speculative=2)
