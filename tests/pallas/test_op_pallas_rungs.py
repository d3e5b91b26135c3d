"""The ops' pallas rungs (`ops.ssd`, `ops.gated_delta_rule`, `ops.attention` with
`implementation="pallas"`) against the same ops' reference rung, values and gradients.

The kernel tests call the kernels' own API; test_partition.py runs these rungs under a mesh
against themselves on one device. Here the rung, with what it adds around the kernels (segment
ids made from the op's document starts, the skip D, the scale, the window), meets the
per-token reference in float64: odd length (19 over chunks of 8), packed documents with ids
that come back (a new document for a recurrence, the same one for attention), an initial and
a final state; float32 kernels in interpret mode with tiny tiles.
(GSA's and NHA's rungs meet their references in test_nha_kernel.py.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from pallas_kernels.delta_rule import api as delta_api
from pallas_kernels.flash_attention import api as flash_api
from pallas_kernels.ssd import api as ssd_api
from tests.helpers import assert_close, kernels_in_interpret_mode, normals
from tests.pallas import test_delta_rule_kernel, test_flash_attention, test_ssd_kernel

T = 19
# Row 0: starts at 3 and 11 (inside chunks of 8) and 16 (on a chunk edge), a 1-token document
# at 10, id 0 back at 11 (a new document for a recurrence, the first one again for attention);
# row 1: one start, at 8 (a chunk edge).
IDS = jnp.asarray([[0] * 3 + [1] * 7 + [2] + [0] * 5 + [3] * 3, [5] * 8 + [4] * 11], jnp.int32)


@pytest.fixture
def pallas_on_cpu(monkeypatch):
    """The ops' pallas rungs run the kernels in interpret mode with the kernel tests' tiles."""
    kernels_in_interpret_mode(
        monkeypatch, ((flash_api, "flash_attention", test_flash_attention.TINY),
                      (delta_api, "gated_delta_rule", test_delta_rule_kernel.TINY),
                      (ssd_api, "ssd", test_ssd_kernel.TINY)),
        ("attention", "delta_rule", "ssd"))


def check(run, inputs, what, tol=1e-5):
    """`run(inputs, implementation)` → pytree of outputs: the pallas rung in float32 against the
    reference in float64, values and the gradients of Σ w·outputs w.r.t. every input."""
    def value_and_grads(implementation, inputs, dtype):
        out_shapes = jax.eval_shape(lambda x: run(x, implementation), inputs)
        weights = jax.tree.map(
            lambda s: jnp.asarray(normals(7, s.shape, dtype=np.float32), dtype), out_shapes)

        def loss(x):
            out = run(x, implementation)
            return sum(jnp.sum(o * w) for o, w in zip(jax.tree.leaves(out),
                                                      jax.tree.leaves(weights), strict=True)), out

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(inputs)

    cast = lambda tree, dtype: jax.tree.map(lambda a: jnp.asarray(np.asarray(a), dtype), tree)
    (_, out), grads = value_and_grads("pallas", cast(inputs, jnp.float32), jnp.float32)
    with jax.enable_x64(True):
        (_, ref), ref_grads = value_and_grads("reference", cast(inputs, jnp.float64),
                                              jnp.float64)
        assert_close(out, ref, tol, f"{what} values")
        for name in inputs:
            assert_close(grads[name], ref_grads[name], tol, f"{what} d{name}")


def test_ssd_rung_documents_state_skip(pallas_on_cpu):
    inputs = test_ssd_kernel.make_inputs(0, batch=2, length=T, heads=4, groups=2)
    inputs["D"] = normals(1, (4,), dtype=np.float32)

    def run(x, implementation):
        return ops.ssd(x["x"], x["dt"], x["A"], x["B"], x["C"], segment_ids=IDS,
                       initial_state=x["initial_state"], D=x["D"], return_final_state=True,
                       chunk_size=8, implementation=implementation)

    check(run, inputs, "ssd")


def test_gated_delta_rule_rung_documents_state(pallas_on_cpu):
    inputs = test_delta_rule_kernel.make_inputs(0, batch=2, length=T, key_dim=8, value_dim=8)

    def run(x, implementation):
        return ops.gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.4,
                                    segment_ids=IDS, initial_state=x["initial_state"],
                                    return_final_state=True, chunk_size=8,
                                    implementation=implementation)

    check(run, inputs, "gated delta rule")


def test_attention_rung_documents_window_gqa(pallas_on_cpu):
    q, k, v = normals(2, (2, T, 4, 8), (2, T, 2, 8), (2, T, 2, 8), dtype=np.float32)

    def run(x, implementation):
        return ops.attention(x["q"], x["k"], x["v"], window=6, scale=0.3, segment_ids=IDS,
                             implementation=implementation)

    check(run, dict(q=q, k=k, v=v), "attention")


def test_attention_rung_wide_values(pallas_on_cpu):
    """Values 3 head dims wide (Oryx's Mamba-2 attention mode: the inner width) run the kernel
    as value slices (`value_heads`), grouped queries and packed documents included."""
    q, k, v = normals(3, (2, T, 4, 8), (2, T, 2, 8), (2, T, 2, 24), dtype=np.float32)

    def run(x, implementation):
        return ops.attention(x["q"], x["k"], x["v"], window=6, segment_ids=IDS,
                             implementation=implementation)

    check(run, dict(q=q, k=k, v=v), "attention, wide values")


def test_attention_rung_active_queries(pallas_on_cpu):
    """Oryx's attention-mode rows only (`active_queries`), with wide values, GQA, documents
    and a window: the rows of block 1 of row 0 (16–18 and the padding) are all inactive, the
    others in part."""
    q, k, v = normals(4, (2, T, 4, 8), (2, T, 2, 8), (2, T, 2, 16), dtype=np.float32)
    active = jnp.asarray([[1] * 3 + [0] * 5 + [1] * 8 + [0] * 3, [0] * 8 + [1] * 11], bool)

    def run(x, implementation):
        return ops.attention(x["q"], x["k"], x["v"], window=6, segment_ids=IDS,
                             active_queries=active, implementation=implementation)

    check(run, dict(q=q, k=k, v=v), "attention, active queries")


def test_a_layer_set_to_the_pallas_rung_generates(pallas_on_cpu):
    """Cached decode steps pass explicit positions, which no fast rung takes: a layer set to
    `implementation="pallas"` (its training forward and the fresh prefill on the kernel)
    raised at the first step of `generate`; they run XLA, and its tokens are auto's."""
    import hybrid_jax as hj
    from hybrid_jax.generate import generate

    config = hj.ModelConfig(layers=("attention",), vocab_size=32, d_model=128, num_heads=2,
                            ffn_dim=64)
    pallas = config.replace(layers=(hj.layer("attention", implementation="pallas"),))
    prompt = np.asarray([[3, 5, 7, 9, 11, 2, 4, 6]], np.int32)
    tokens = [np.asarray(generate(hj.create_model(c, seed=0), prompt, 3))
              for c in (config, pallas)]
    np.testing.assert_array_equal(tokens[1], tokens[0])
