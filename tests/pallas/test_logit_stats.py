"""The logit-statistics Pallas kernel (interpret mode) against a float64 numpy per-row
reference and against the op's XLA rung: random rows over several programs and vocabulary
tiles (the last ones partial), ties within and across tiles, rows with NaN, ±∞ and only −∞,
targets that count from the end or fall outside the vocabulary, bf16 logits, both loop forms;
the Triton lowering at the 125M shape; the errors and the dispatch (the XLA rung on CPU, the
kernel refused where a mesh splits the rows' vocabulary).

Tiny tiles (4 rows, 16 columns) so that 11 rows of 70 columns span 3 programs of 5 steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax import ops
from hybrid_jax.ops import dispatch
from hybrid_jax.ops.logit_stats import _RUNGS as op_rungs
from hybrid_jax.ops.logit_stats import _pallas_unsupported, logit_stats_xla
from pallas_kernels.logit_stats import api
from pallas_kernels.logit_stats.block_sizes import BlockSizes
from tests.helpers import normals

TINY = BlockSizes(block_rows=4, block_vocab=16)
ROWS, V = 11, 70


def reference(logits, targets):
    """(top, best, sum_exp, target_logit) row by row in float64, from the definitions."""
    out = []
    for row, t in zip(np.asarray(logits, np.float64), np.asarray(targets), strict=True):
        nan = np.isnan(row)
        best = int(np.flatnonzero(nan)[0]) if nan.any() else int(np.flatnonzero(
            row == row.max())[0])
        top = row[best]
        shift = top if np.isfinite(top) else 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            sum_exp = np.sum(np.exp(row - shift))
        picked = row[t] if -len(row) <= t < len(row) else np.nan
        out.append((top, best, sum_exp, picked))
    return tuple(np.array(x) for x in zip(*out, strict=True))


def special_rows():
    """Random rows with ties, NaN, ±∞, −∞-only and huge negative rows written in."""
    logits = np.random.default_rng(0).standard_normal((ROWS, V))
    logits[0, [3, 40]] = 9.0  # a tie across tiles: the first wins
    logits[1, [20, 21]] = 9.0  # a tie within a tile
    logits[2, [50, 5]] = [np.inf, np.nan]  # NaN counts as the largest, even after +∞
    logits[3, [66, 69]] = np.nan  # two NaN in the last, partial tile: the first
    logits[4, 33] = np.inf  # +∞: Σ exp is ∞
    logits[5] = -np.inf  # nothing above −∞: index 0, Σ exp 0
    logits[6] = -1e30  # finite and far below 0
    logits[6, 17] = -1e29
    logits[7, 69] = 50.0  # the maximum in the last column
    targets = np.arange(ROWS) * 7 % V
    targets[[8, 9, 10]] = [-1, -V, V]  # from the end, the first, out of range
    return logits, targets


def assert_stats_equal(got, want):
    """Every statistic equal (NaN where NaN), Σ exp within float32 summation order."""
    top, best, sum_exp, picked = (np.asarray(x) for x in want)
    np.testing.assert_array_equal(np.asarray(got.best), best)
    np.testing.assert_array_equal(np.asarray(got.top), top.astype(np.float32))
    np.testing.assert_allclose(np.asarray(got.sum_exp), sum_exp, rtol=2e-6)
    np.testing.assert_array_equal(np.asarray(got.target_logit), picked.astype(np.float32))


@pytest.mark.parametrize("prefetch", [False, True])
def test_matches_reference(prefetch):
    logits, targets = special_rows()
    blocks = BlockSizes(block_rows=4, block_vocab=16, prefetch=prefetch)
    got = api.logit_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
                          block_sizes=blocks, interpret=True)
    assert_stats_equal(got, reference(logits.astype(np.float32), targets))


def test_matches_the_xla_rung_with_leading_axes():
    logits = normals(1, (2, 5, 300), dtype=np.float32) * 4
    targets = jnp.asarray(np.random.default_rng(2).integers(0, 300, (2, 5)))
    got = api.logit_stats(logits, targets, block_sizes=BlockSizes(block_rows=2,
                                                                  block_vocab=64),
                          interpret=True)
    assert got.top.shape == (2, 5) and got.best.dtype == jnp.int32
    assert_stats_equal(got, logit_stats_xla(logits, targets))


def test_xla_rung_matches_reference():
    logits, targets = special_rows()
    got = ops.logit_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets))
    assert_stats_equal(got, reference(logits.astype(np.float32), targets))


def test_bfloat16_logits_are_read_as_float32():
    logits = normals(3, (ROWS, V), dtype=np.float32).astype(jnp.bfloat16)
    targets = jnp.arange(ROWS)
    got = api.logit_stats(logits, targets, block_sizes=TINY, interpret=True)
    assert_stats_equal(got, reference(np.asarray(logits, np.float32), targets))


def test_lowers_to_triton_at_the_125m_shape(monkeypatch):
    """The default tiles build one Triton kernel for float32 [16, 2048, 32768] logits (Pallas'
    Triton lowering, no GPU needed)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    spec = jax.ShapeDtypeStruct
    text = jax.jit(api.logit_stats).trace(spec((16, 2048, 32768), jnp.float32),
                                          spec((16, 2048), jnp.int32)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("shapes, dtypes, message", [
    (((4, 6), (5,)), (jnp.float32, jnp.int32),
     r"targets must have the logits' leading shape \(4,\), got \(5,\)"),
    (((4, 6), (4,)), (jnp.float32, jnp.float32), "targets must be integers, got float32"),
    (((4, 6), (4,)), (jnp.int32, jnp.int32), "logits must be floating, got int32"),
    (((4, 0), (4,)), (jnp.float32, jnp.int32), r"expected logits \[..., V\] with V >= 1"),
])
def test_bad_inputs_are_named(shapes, dtypes, message):
    logits, targets = (jnp.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True))
    with pytest.raises(ValueError, match=message):
        api.logit_stats(logits, targets, interpret=True)


def test_platform_and_mesh_refusals_are_named():
    logits, targets = jnp.zeros((4, 6)), jnp.zeros(4, jnp.int32)
    with pytest.raises(ValueError, match="run on GPUs .* target platform is cpu"):
        api.logit_stats(logits, targets)
    with pytest.raises(ValueError, match="implementation='pallas' cannot run this call"):
        ops.logit_stats(logits, targets, implementation="pallas")
    mesh = jax.sharding.AbstractMesh((2, 4), ("data", "tensor"))
    with jax.sharding.use_abstract_mesh(mesh):
        reason = _pallas_unsupported(logits, targets)
    assert reason.startswith("the mesh splits tensor (4 devices)")
    with pytest.raises(ValueError, match="targets must be integers"):
        ops.logit_stats(logits, targets.astype(jnp.float32))


def test_auto_picks_the_kernel_on_gpus_and_logs_a_split_vocabulary(monkeypatch, caplog):
    """On a GPU the loss's statistics take the kernel at the 125M shape; under a mesh whose
    `tensor` axis splits the vocabulary the XLA rung runs, with the reason logged."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    logits = jax.ShapeDtypeStruct((16, 2048, 32768), jnp.float32)
    targets = jax.ShapeDtypeStruct((16, 2048), jnp.int32)
    rung, reasons = dispatch.choose("logit_stats", op_rungs, None, logits, targets)
    assert (rung.name, reasons) == ("pallas", [])
    mesh = jax.sharding.AbstractMesh((2, 4), ("data", "tensor"))
    with jax.sharding.use_abstract_mesh(mesh), caplog.at_level("WARNING", "hybrid_jax.dispatch"):
        jax.eval_shape(ops.logit_stats, logits, targets)
    assert "logit_stats: ran the xla rung" in caplog.text
    assert "the mesh splits tensor (4 devices)" in caplog.text


def test_empty_inputs_are_refused():
    """No rows: a reason, not a crash in the kernel (the XLA rung takes it)."""
    assert "at least one row" in api.unsupported(jnp.zeros((0, 5)), jnp.zeros((0,), jnp.int32),
                                                 interpret=True)
