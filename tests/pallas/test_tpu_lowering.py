"""The Pallas TPU kernels (SSD, NHA, GSA's NHA-at-window-0, GDN), lowered for a TPU on the CPU.

Each case runs an op's `implementation="pallas"` rung, forward and backward (a VJP through the
kernels' custom VJP), traced for a TPU (`tests.helpers.lower_for_tpu`: the op dispatches to
the Mosaic kernels, not interpreted) at the shapes real models use: T = 8192, head dims 64 /
128 / 256, bf16 and float32, with and without packed documents and initial states, and the
NHA windows of the presets. Nothing runs: lowering checks the block shapes against Mosaic's
(8, 128) rule and lowers every kernel body to Mosaic MLIR. The default suite keeps one case
per kernel family (a preset's shape, with documents and an initial state); `-m slow` runs the
rest.

`test_kernels_compile_for_tpu` goes further where libtpu is installed (it is not a project
dependency): it compiles the same cases with libtpu's compiler for a TPU topology (no TPU
needed), which runs Mosaic's own passes (layouts, VMEM limits). How to install it is in
pallas_kernels/ssd/NOTES.md, "TPU lowering".
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from hybrid_jax.ops.delta_rule import gated_delta_rule
from hybrid_jax.ops.gsa import gated_slot_attention
from hybrid_jax.ops.nha import NHAState, native_hybrid_attention
from hybrid_jax.ops.ssd import ssd
from tests.helpers import compile_for_tpu, lower_for_tpu

B, T = 2, 8192
F32, BF16 = jnp.float32, jnp.bfloat16


def _spec(*shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _grads(op, kwargs, names):
    """fn(*arrays) of the arrays `names`: the op's outputs and their VJP (the outputs as
    cotangents) for every array but the segment ids."""
    diff_names = [n for n in names if n != "segment_ids"]

    def fn(*arrays):
        given = dict(zip(names, arrays, strict=True))
        fixed = {n: a for n, a in given.items() if n not in diff_names}
        call = lambda *diff: op(**dict(zip(diff_names, diff, strict=True)), **fixed, **kwargs)
        out, vjp = jax.vjp(call, *(given[n] for n in diff_names))
        return out, vjp(out)

    return fn


def ssd_case(head_dim, dtype, documents, initial, state_dim=128, heads=4, groups=1):
    arrays = dict(x=_spec(B, T, heads, head_dim, dtype=dtype), dt=_spec(B, T, heads, dtype=F32),
                  A=_spec(heads, dtype=F32), B=_spec(B, T, groups, state_dim, dtype=dtype),
                  C=_spec(B, T, groups, state_dim, dtype=dtype))
    if initial:
        arrays["initial_state"] = _spec(B, heads, head_dim, state_dim, dtype=F32)
    if documents:
        arrays["segment_ids"] = _spec(B, T, dtype=jnp.int32)
    return ssd, dict(return_final_state=True, implementation="pallas"), arrays


def nha_case(head_dim, dtype, window, documents=False, initial=False, slots=64, heads=4,
             kv_heads=2):
    arrays = dict(q=_spec(B, T, heads, head_dim, dtype=dtype),
                  k=_spec(B, T, kv_heads, head_dim, dtype=dtype),
                  v=_spec(B, T, kv_heads, head_dim, dtype=dtype),
                  s=_spec(B, T, kv_heads, slots, dtype=dtype),
                  g=_spec(B, T, kv_heads, slots, dtype=dtype))
    if initial:  # an NHAState with a ring of w tokens
        ring = lambda d, dt=dtype: _spec(B, window, kv_heads, d, dtype=dt)
        arrays["initial_state"] = NHAState(
            slot_keys=_spec(B, kv_heads, head_dim, slots, dtype=F32),
            slot_values=_spec(B, kv_heads, slots, head_dim, dtype=F32), keys=ring(head_dim),
            values=ring(head_dim), s=ring(slots), g=ring(slots), window_keys=ring(head_dim),
            document_start=_spec(B, dtype=jnp.int32), length=_spec(dtype=jnp.int32))
    if documents:
        arrays["segment_ids"] = _spec(B, T, dtype=jnp.int32)
    return native_hybrid_attention, dict(window=window, return_final_state=initial,
                                         implementation="pallas"), arrays


def gsa_case(head_dim, dtype, documents=False, initial=False, slots=64, heads=4):
    arrays = dict(q=_spec(B, T, heads, head_dim, dtype=dtype),
                  k=_spec(B, T, heads, head_dim, dtype=dtype),
                  v=_spec(B, T, heads, head_dim, dtype=dtype),
                  s=_spec(B, T, heads, slots, dtype=dtype),
                  g=_spec(B, T, heads, slots, dtype=dtype))
    if initial:
        arrays["initial_state"] = (_spec(B, heads, head_dim, slots, dtype=F32),
                                   _spec(B, heads, slots, head_dim, dtype=F32))
    if documents:
        arrays["segment_ids"] = _spec(B, T, dtype=jnp.int32)
    return gated_slot_attention, dict(return_final_state=True, implementation="pallas"), arrays


def gdn_case(head_dim, dtype, documents, initial, heads=4):
    arrays = dict(q=_spec(B, T, heads, head_dim, dtype=dtype),
                  k=_spec(B, T, heads, head_dim, dtype=dtype),
                  v=_spec(B, T, heads, head_dim, dtype=dtype), g=_spec(B, T, heads, dtype=F32),
                  beta=_spec(B, T, heads, dtype=F32))
    if initial:
        arrays["initial_state"] = _spec(B, heads, head_dim, head_dim, dtype=F32)
    if documents:
        arrays["segment_ids"] = _spec(B, T, dtype=jnp.int32)
    return gated_delta_rule, dict(return_final_state=True, implementation="pallas"), arrays


def kernel_names(case) -> list[str]:
    op, kwargs, arrays = case
    text = lower_for_tpu(_grads(op, kwargs, list(arrays)), *arrays.values())
    assert "tpu_custom_call" in text
    return re.findall(r'kernel_name = "(\w+)"', text)


SSD_KERNELS = ["ssd_forward", "ssd_state_grads", "ssd_chunk_grads"]
GDN_KERNELS = ["gated_delta_rule_tpu_forward", "gated_delta_rule_tpu_backward"]
_SLOTS_FORWARD = ["nha_chunk_prepare", "nha_chunk_scan", "nha_chunk_scan", "nha_slot_logits"]
_SLOTS_BACKWARD = ["nha_slot_backward_queries", "nha_chunk_deltas_reverse",
                   "nha_chunk_scan_reverse", "nha_chunk_scan_reverse", "nha_backward_slot_inputs"]
_WINDOW_BACKWARD = ["nha_window_backward_queries", "nha_backward_window_keys"]
NHA_KERNELS = (_SLOTS_FORWARD + ["nha_window_attention", "nha_slot_readout_add"]
               + _WINDOW_BACKWARD + _SLOTS_BACKWARD)
SLOTS_ONLY_KERNELS = _SLOTS_FORWARD + ["nha_slot_readout"] + _SLOTS_BACKWARD  # w = 0: GSA
WINDOW_ONLY_KERNELS = ["nha_window_attention"] + _WINDOW_BACKWARD  # w ≥ T: causal attention

# (id, case, kernels, in the default suite). Head dims: Mamba-2 presets P = 64 (N = 128),
# nha-340m 256, the benchmark shape 128; windows: nha-340m's 32, the benchmark's 512,
# 100 (not a multiple of the chunk: delayed slot inputs), 0 (GSA) and ≥ T (the full causal
# windows of the hybrid presets).
CASES = [
    ("ssd-P64-bf16-documents-state", ssd_case(64, BF16, True, True), SSD_KERNELS, True),
    ("ssd-P128-f32", ssd_case(128, F32, False, False), SSD_KERNELS, False),
    ("ssd-P256-bf16-documents", ssd_case(256, BF16, True, False, heads=2), SSD_KERNELS, False),
    ("ssd-P128-bf16-state-groups", ssd_case(128, BF16, False, True, groups=2), SSD_KERNELS,
     False),
    ("ssd-P64-f32-documents-N64", ssd_case(64, F32, True, False, state_dim=64), SSD_KERNELS,
     False),
    ("ssd-P256-f32-state", ssd_case(256, F32, False, True), SSD_KERNELS, False),
    # The gated delta rule's TPU kernels (their own lowering test: tests/pallas/
    # test_delta_rule_tpu.py), here for the compile check.
    ("gdn-K64-f32", gdn_case(64, F32, False, False), GDN_KERNELS, False),
    ("gdn-K256-bf16-documents-state", gdn_case(256, BF16, True, True), GDN_KERNELS, False),
    ("nha-D256-bf16-w32-documents-state", nha_case(256, BF16, 32, True, True), NHA_KERNELS,
     True),
    ("nha-D256-bf16-w32", nha_case(256, BF16, 32), NHA_KERNELS, False),
    ("nha-D128-bf16-w512-documents", nha_case(128, BF16, 512, True), NHA_KERNELS, False),
    ("nha-D64-f32-w100-state", nha_case(64, F32, 100, initial=True), NHA_KERNELS, False),
    ("nha-D128-bf16-w512", nha_case(128, BF16, 512), NHA_KERNELS, False),
    ("nha-D64-f32-w512", nha_case(64, F32, 512), NHA_KERNELS, False),
    ("nha-D256-f32-w512", nha_case(256, F32, 512, heads=2, kv_heads=1), NHA_KERNELS, False),
    ("nha-D128-bf16-w100-slots16", nha_case(128, BF16, 100, slots=16), NHA_KERNELS, False),
    ("nha-D64-bf16-w0", nha_case(64, BF16, 0), SLOTS_ONLY_KERNELS, False),
    ("nha-D256-bf16-full-window", nha_case(256, BF16, T), WINDOW_ONLY_KERNELS, False),
    ("nha-D128-bf16-full-window-documents", nha_case(128, BF16, T, True), WINDOW_ONLY_KERNELS,
     False),
    ("gsa-D128-bf16-documents-state", gsa_case(128, BF16, True, True), SLOTS_ONLY_KERNELS,
     True),
    ("gsa-D64-f32", gsa_case(64, F32), SLOTS_ONLY_KERNELS, False),
    ("gsa-D256-bf16-documents", gsa_case(256, BF16, True, heads=2), SLOTS_ONLY_KERNELS, False),
    ("gsa-D64-bf16-state", gsa_case(64, BF16, initial=True), SLOTS_ONLY_KERNELS, False),
]
OTHER_GENERATIONS = ("v5p:2x2x1", "v6e:2x2", "v4:2x2x1")
# Mosaic on a v4 has no sublane gather, which the kernels' `[rows]` vector → `[rows, 1]` column
# conversions take (SSD's per-step vectors, NHA's lse and D): NOTES.md, "TPU lowering".
_V4 = pytest.mark.xfail(reason="no sublane gather on a v4 (NOTES.md)", strict=True)


def _params(cases, *extra, all_slow=False):
    return [pytest.param(case, *extra, kernels, id="-".join((name, *extra)),
                         marks=(() if default and not all_slow else (pytest.mark.slow,))
                         + ((_V4,) if "v4:2x2x1" in extra else ()))
            for name, case, kernels, default in cases]


@pytest.mark.parametrize("case, kernels", _params(CASES))
def test_kernels_lower_for_tpu(case, kernels):
    """Forward and backward of the op's pallas rung lower for a TPU to exactly these Mosaic
    kernels (no interpret mode, no XLA fallback)."""
    assert kernel_names(case) == kernels


@pytest.mark.slow
@pytest.mark.parametrize("case, topology, kernels", _params(CASES, "v5e:2x2") + [
    param for topology in OTHER_GENERATIONS
    for param in _params([c for c in CASES if c[3]], topology, all_slow=True)])
def test_kernels_compile_for_tpu(case, topology, kernels):
    """Every case compiles with libtpu's compiler (Mosaic's passes: layouts, VMEM) for one
    chip of a v5e (and the default cases for a v5p and a v6e; not for a v4). Needs libtpu (not
    a project dependency; pallas_kernels/ssd/NOTES.md, "TPU lowering")."""
    pytest.importorskip("libtpu")
    op, kwargs, arrays = case
    compile_for_tpu(_grads(op, kwargs, list(arrays)), *arrays.values(), topology=topology)
