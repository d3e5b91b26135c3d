"""Model-level invariances of the tiny presets, where wiring bugs hide that per-op tests miss:
batch rows are independent and every logit is causal (under packed segment ids with an id that
comes back later in a row, restarting positions, windows and Oryx's mixed modes); scanned
layers under a remat policy give the plain loop's logits and gradients. Per-preset decode,
packing, gradient accumulation and generation are in test_lm, test_packed_presets,
train/test_step_options and test_generate_text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import presets
from hybrid_jax.nn.lm import LanguageModel
from hybrid_jax.nn.oryx import MODE
from tests.helpers import assert_close, shared_model

T, CUT = 19, 9  # tokens per row; the rows' tokens from CUT on are changed
LENGTHS, IDS = (6, 8, 5), (1, 2, 1)  # documents of a row: id 1 comes back after id 2


def _context(batch: int):
    ids = np.concatenate([np.full(n, i) for n, i in zip(LENGTHS, IDS, strict=True)])
    positions = np.concatenate([np.arange(n) for n in LENGTHS])
    return (jnp.asarray(np.broadcast_to(positions, (batch, T))),
            jnp.asarray(np.broadcast_to(ids, (batch, T))))


@pytest.mark.parametrize("name", [
    "swa-transformer-tiny", "gdn-hybrid-tiny", "gsa-hybrid-tiny", "gss-tiny",
    "mamba2-hybrid-tiny", "nha-hybrid-tiny", "oryx-gdn-tiny", "oryx-mamba2-tiny", "pha-tiny"])
def test_rows_are_independent_and_logits_causal(name):
    """Row 0's logits do not change when row 1 does, nor its logits before CUT when its tokens
    from CUT on do."""
    model = shared_model(presets.get(name))
    if name == "swa-transformer-tiny":
        model = model.with_window(3)  # inside the documents (its own 16 is not)
    rng = np.random.default_rng(0)
    x, other, later = (rng.integers(0, model.config.vocab_size, (T,)) for _ in range(3))
    changed = np.concatenate([x[:CUT], later[CUT:]])
    positions, segments = _context(2)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t, extras: nnx.merge(graphdef, s)(
        t, positions_BT=positions, segment_ids_BT=segments, extras=extras))
    modes = {}
    if name.startswith("oryx"):  # mixed linear / attention tokens; row 1's own in b
        modes = rng.integers(0, 2, (2, T))
        modes = [{MODE: jnp.asarray(m, jnp.int32)} for m in (modes[[0, 0]], modes)]
    a = np.asarray(forward(state, jnp.asarray([x, changed], jnp.int32), modes and modes[0]))
    b = np.asarray(forward(state, jnp.asarray([x, other], jnp.int32), modes and modes[1]))
    np.testing.assert_allclose(b[0], a[0], rtol=1e-6, atol=1e-6, err_msg="row 0 saw row 1")
    np.testing.assert_allclose(a[1, :CUT], a[0, :CUT], rtol=1e-6, atol=1e-6,
                               err_msg="logits before the cut saw later tokens")
    assert np.abs(a[1, CUT:] - a[0, CUT:]).max() > 1e-3  # the change shows after the cut


@pytest.mark.parametrize("name, remat", [("pha-tiny", "kernels"),
                                         ("mamba2-hybrid-tiny", "dots_saveable"),
                                         ("gdn-hybrid-tiny", "full")])
def test_scanned_and_rematerialised_equal_the_plain_loop(name, remat):
    """Two groups of the preset's layers (two layer types in the hybrids) stacked for
    `nnx.scan` and rematerialised: the plain model's logits and gradients (every parameter's,
    unstacked)."""
    config = presets.get(name)
    if len(config.layers) == 2 and config.layers[0] != config.layers[1]:
        config = config.replace(layers=config.layers * 2)  # else one group: a trivial scan
    plain = shared_model(config)
    config = config.replace(remat=remat)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))))
    scanned = nnx.merge(graphdef, nnx.state(plain)).with_scan_layers(True)
    assert scanned.config.scan_layers and scanned.config.remat == remat
    rng = np.random.default_rng(1)
    tokens, targets = (jnp.asarray(rng.integers(0, config.vocab_size, (2, T)), jnp.int32)
                       for _ in range(2))
    positions, segments = _context(2)

    def loss(model):
        logits = model(tokens, positions_BT=positions, segment_ids_BT=segments)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)
        return jnp.mean(nll), logits

    value_and_grad = nnx.value_and_grad(loss, has_aux=True)
    (_, expected), expected_grads = nnx.jit(value_and_grad)(plain)
    (_, logits), grads = nnx.jit(value_and_grad)(scanned)
    assert_close(logits, expected, 1e-6, "logits")
    unstacked = nnx.merge(nnx.graphdef(scanned), grads).with_scan_layers(False)
    assert_close(nnx.state(unstacked), expected_grads, 1e-5, "gradients")
