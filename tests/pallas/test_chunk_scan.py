"""The chunk scans (slot states at chunk boundaries) of the GPU and TPU kernels, in interpret
mode, against a float64 numpy loop of the chunk recurrence, forward and reverse, from an
initial state, with the final one."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.nha import gpu, tpu
from pallas_kernels.nha.block_sizes import BlockSizes
from pallas_kernels.nha.layout import Static
from tests.helpers import assert_close


def loop_states(delta, log_decay, reverse, initial):
    """out[c] = S before chunk c is added: S ← S·e^{ℓ_c} + Δ_c, in chunk (or reverse) order from
    S = initial; and the last S."""
    delta, log_decay = np.asarray(delta, np.float64), np.asarray(log_decay, np.float64)
    out = np.zeros_like(delta)
    state = np.asarray(initial, np.float64)
    num_chunks = delta.shape[1]
    for c in reversed(range(num_chunks)) if reverse else range(num_chunks):
        out[:, c] = state
        state = state * np.exp(log_decay[:, c]) + delta[:, c]
    return out, state


def make(seed, num_chunks, strong=False):
    rng = np.random.default_rng(seed)
    delta = rng.standard_normal((2, num_chunks, 3, 4, 5)).astype(np.float32)
    log_decay = -rng.exponential(0.3, (2, num_chunks, 3, 1, 5)).astype(np.float32)
    if strong:  # chunks that wipe a slot (e^{-1e30} = 0: a document start), next to weak ones
        log_decay[0, ::3] = -1e30
        log_decay[1, 1::4, :, :, :2] = -60.0
    return jnp.asarray(delta), jnp.asarray(log_decay)


def static(**blocks) -> Static:
    return Static(window=0, scale=1.0, slots=True, mask_empty=True, group=1, interpret=True,
                  blocks=BlockSizes(**blocks))


# 12 chunks: 1, 2 or gcd(8, 12) = 4 chunk steps per loop iteration.
@pytest.mark.parametrize("state_group", [1, 2, 8])
@pytest.mark.parametrize("reverse", [False, True])
def test_gpu_scan_matches_loop(state_group, reverse):
    delta, log_decay = make(3, 12, strong=True)
    delta = jnp.pad(delta, [(0, 0)] * 3 + [(0, 4), (0, 0)])  # width 8: two feature tiles of 4
    st = static(state_block=4, state_group=state_group)
    other = 2.0 * delta[..., ::-1, :]  # a second delta of the same width (one kernel)
    narrow = delta[:, :, :, :4]  # and one of another width (its own kernel)
    deltas = (delta, other, narrow)
    initial = [jnp.cos(jnp.arange(d[:, 0].size, dtype=jnp.float32)).reshape(d[:, 0].shape)
               for d in deltas]
    got, finals = gpu.chunk_scan(deltas, log_decay, st, reverse=reverse, initial=initial)
    for name, x, init, y, final in zip(("delta", "other", "narrow"), deltas, initial, got,
                                       finals, strict=True):
        expected, last = loop_states(x, log_decay, reverse, init)
        assert_close(y, expected, 1e-6, f"{name} reverse={reverse}")
        assert_close(final, last, 1e-6, f"{name} final reverse={reverse}")


@pytest.mark.parametrize("reverse", [False, True])
def test_tpu_scan_matches_loop(reverse):
    delta, log_decay = make(4, 5, strong=True)
    initial = jnp.sin(jnp.arange(delta[:, 0].size, dtype=jnp.float32)).reshape(delta[:, 0].shape)
    [got], [final] = tpu.chunk_scan((delta,), log_decay, static(), reverse=reverse,
                                    initial=(initial,))
    expected, last = loop_states(delta, log_decay, reverse, initial)
    assert_close(got, expected, 1e-6, f"reverse={reverse}")
    assert_close(final, last, 1e-6, f"final reverse={reverse}")

