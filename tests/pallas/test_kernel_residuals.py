"""`remat="kernels"`: the kernels tag their outputs and residuals (`pallas_kernels/residuals.py`)
so that under `save_only_these_names(KERNEL_RESIDUALS)` the compiled backward of a
rematerialised call runs no forward kernel, while a full remat runs them again; the gradients
are the full remat's. Interpret mode on the CPU (the kernels' names survive in the
compiled HLO's metadata)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.delta_rule import api as delta_api
from pallas_kernels.flash_attention import api as flash_api
from pallas_kernels.nha import api as nha_api
from pallas_kernels.residuals import KERNEL_RESIDUALS
from pallas_kernels.short_conv import api as short_conv_api
from pallas_kernels.ssd import api as ssd_api
from tests.pallas import test_delta_rule_kernel as delta_tests
from tests.pallas import test_flash_attention as flash_tests
from tests.pallas import test_nha_kernel as nha_tests
from tests.pallas import test_short_conv as short_conv_tests
from tests.pallas import test_ssd_kernel as ssd_tests

T = 24  # three chunks of 8


def _delta_rule():
    x = delta_tests.make_inputs(0, 1, T)
    run = lambda q, k, v: delta_api.gated_delta_rule(
        q, k, v, x["g"], x["beta"], initial_state=x["initial_state"],
        block_sizes=delta_tests.TINY, interpret=True)[0]
    return run, (x["q"], x["k"], x["v"]), {
        "gated_delta_rule_chunk_prepare", "gated_delta_rule_chunk_states",
        "gated_delta_rule_chunk_outputs"}


def _flash_attention():
    q, k, v = (jnp.asarray(np.random.default_rng(i).normal(size=(2, T, 2, 16)), jnp.float32)
               for i in range(3))
    ids = flash_tests.segments_from_lengths([8, 1, 15], [5, 19])
    run = lambda q, k, v: flash_api.flash_attention(q, k, v, ids, block_sizes=flash_tests.TINY,
                                                    interpret=True)
    return run, (q, k, v), {"flash_attention_forward"}


def _ssd():
    x = ssd_tests.make_inputs(0, 1, T, 2, 1)
    run = lambda xs, B, C: ssd_api.ssd(xs, x["dt"], x["A"], B, C, block_sizes=ssd_tests.TINY,
                                       interpret=True)[0]
    return run, (x["x"], x["B"], x["C"]), {"ssd_forward"}


def _nha():
    x = nha_tests.make_inputs(0, 1, T, 2, 1)
    run = lambda q, k, v: nha_api.native_hybrid_attention(
        q, k, v, x["s"], x["g"], window=5, q_window=x["q_window"], k_window=x["k_window"],
        block_sizes=nha_tests.TINY, interpret=True)
    return run, (x["q"], x["k"], x["v"]), {
        "nha_chunk_prepare", "nha_chunk_scan", "nha_slot_logits", "nha_slot_logits_exact",
        "nha_window_attention", "nha_slot_readout_add", "nha_slot_readout_add_exact"}


def _short_conv():
    x, w, _, _ = short_conv_tests.inputs(0, 2, T, 4)
    ids = jnp.asarray(short_conv_tests.segments_from_lengths([8, 1, 15], [5, 19]))
    run = lambda x, w: short_conv_api.short_conv(x, w, segment_ids=ids,
                                                 block_sizes=short_conv_tests.TINY,
                                                 interpret=True)
    return run, (x, w), {"short_conv_forward"}


KERNELS = {"delta_rule": _delta_rule, "flash_attention": _flash_attention, "ssd": _ssd,
           "nha": _nha, "short_conv": _short_conv}


def backward(run, args, policy):
    """(the names of the kernels in the compiled backward, the gradients) of
    Σ tanh(run(args))² under `jax.checkpoint(policy=policy)`."""
    layer = jax.checkpoint(lambda *a: jnp.tanh(run(*a)), policy=policy)
    out, vjp = jax.vjp(layer, *args)
    ct = 2 * out
    compiled = jax.jit(vjp).lower(ct).compile()
    names = re.findall(r"\b(?:gated_delta_rule|flash_attention|ssd|nha|short_conv)_\w+",
                       compiled.as_text())
    return set(names), compiled(ct)


@pytest.mark.parametrize("kernel", KERNELS)
def test_saved_kernel_residuals_keep_the_forward_kernels_out_of_the_backward(kernel):
    run, args, forward_kernels = KERNELS[kernel]()
    full, full_grads = backward(run, args, None)
    assert forward_kernels & full, f"a full remat should run {forward_kernels} again"
    names = jax.checkpoint_policies.save_only_these_names(KERNEL_RESIDUALS)
    kept, kept_grads = backward(run, args, names)
    assert not forward_kernels & kept, f"forward kernels in the backward: {forward_kernels & kept}"
    assert kept, "the backward kernels should be there"
    # The same gradients, to float32 rounding: two programs compiled apart may round apart
    # (short_conv: 2.7e-6 between them, each 2.3-3.1e-6 from a float64 run, once XLA compiled
    # each module in one piece).
    for got, want in zip(kept_grads, full_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
