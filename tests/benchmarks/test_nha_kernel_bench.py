"""`experiments/benchmarks/nha_kernel.py`'s inputs: `--gate-offset` puts every chunk on the
kernels' exact path with its sub-chunks one piece each, `--extreme-slot` then splits every
chunk's sub-chunks by level; the default keeps every chunk on the fast path. Its tile variants
are the GPU defaults with fields changed."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import nha_kernel
from pallas_kernels.nha.block_sizes import default_block_sizes
from pallas_kernels.nha.chunk_math import FAST_PATH_LIMIT

_BLOCKS = default_block_sizes("gpu", nha_kernel.DIM)  # the benchmark's tiles
CHUNK, SUB_CHUNK = _BLOCKS.chunk, _BLOCKS.sub_chunk


def _gates(offset: float, extreme: bool = False) -> np.ndarray:
    x = nha_kernel.make_inputs(1, 4 * CHUNK, 2, 2, jax.random.key(0), dtype=jnp.float32, dim=8,
                               gate_offset=offset, extreme_slot=extreme)
    return np.asarray(x["g"], np.float64)[0]  # [T, heads, slots]


def _strongest_sub_chunk(g: np.ndarray) -> np.ndarray:
    """Per head: the strongest decay of one sub-chunk (its rows after the first), any slot."""
    blocks = g.reshape(-1, SUB_CHUNK, *g.shape[1:])[:, 1:].sum(axis=1)
    return blocks.min(axis=(0, 2))


def test_gate_offset_takes_every_chunk_to_the_exact_path():
    for extreme in (False, True):
        g = _gates(nha_kernel.STRONG_GATES, extreme)
        per_chunk = g.reshape(4, CHUNK, *g.shape[1:]).sum(axis=1)
        assert np.all(per_chunk < -FAST_PATH_LIMIT)
        strongest = _strongest_sub_chunk(g)  # one piece while above -60, else the levels
        assert np.all(strongest < -FAST_PATH_LIMIT if extreme else strongest > -FAST_PATH_LIMIT)


def test_default_gates_keep_every_chunk_on_the_fast_path():
    g = _gates(0.0)
    assert np.all(g.reshape(4, CHUNK, *g.shape[1:]).sum(axis=1) > -FAST_PATH_LIMIT)


def test_variants_change_the_gpu_defaults():
    assert nha_kernel.VARIANTS["default"] == _BLOCKS
    for name, blocks in nha_kernel.VARIANTS.items():
        assert blocks == dataclasses.replace(_BLOCKS, **nha_kernel.VARIANT_CHANGES[name])
        if name != "default":
            assert blocks != _BLOCKS, f"variant {name!r} is the defaults"
    distinct = {dataclasses.astuple(b) for b in nha_kernel.VARIANTS.values()}
    assert len(distinct) == len(nha_kernel.VARIANTS), "two variants are the same tiles"
