"""The CPU race check of the GPU kernels (`experiments/benchmarks/triton_races.py`): its TTGIR
analysis on small hand-written kernels (the race of NHA session 19, and the forms that are not
one), and the capture of a kernel's Triton IR lowered for CUDA on this CPU. (Compiling to TTGIR
needs pip Triton, not a dependency: not run here.)"""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from experiments.benchmarks import triton_races
from experiments.benchmarks.triton_races import Finding, in_flight_dots

# One loop step of a pipelined kernel: the tile %x (a buffer of `slots` slots) is read into
# registers and by an async dot; then a wait, other dots, and the next step's copy into %x.
STEP = """tt.func public @kernel(%ptr: tensor<64x64x!tt.ptr<bf16>>) {{
  %buf = ttg.local_alloc : () -> !ttg.memdesc<{slots}x64x64xbf16, #shared, #smem, mutable>
  %keys = ttg.local_alloc : () -> !ttg.memdesc<2x64x64xbf16, #shared, #smem, mutable>
  %r:2 = scf.for %i = %c0 to %c4 step %c1 iter_args(%a = %z, %b = %z) -> (f32, f32) {{
    %x = ttg.memdesc_index %buf[%c0_i32] : !ttg.memdesc<1x64x64xbf16> -> !ttg.memdesc<64x64xbf16>
    %k = ttg.memdesc_index %keys[%i] : !ttg.memdesc<2x64x64xbf16> -> !ttg.memdesc<64x64xbf16>
    %reg = ttg.local_load %x : !ttg.memdesc<64x64xbf16> -> tensor<64x64xbf16>
    %d = ttng.warp_group_dot %x, %k, %a {{isAsync = true}} : t
    %w:2 = ttng.warp_group_dot_wait %d, %x {{pendings = {pendings} : i32}} : t
{later}    %c = ttg.async_copy_global_to_local %ptr, %x mask %m : t
    scf.yield %w#0, %b : f32, f32
  }}
  tt.return
}}
"""
LATER_DOT = """    %e{n} = ttng.warp_group_dot %reg, %k, %b {{isAsync = true}} : t
    %f{n}:2 = ttng.warp_group_dot_wait %e{n} {{pendings = {pendings} : i32}} : t
"""


def step(slots=1, pendings=1, later=()):
    """The loop step, with a dot and its wait after %x's for each of `later`'s pendings."""
    text = "".join(LATER_DOT.format(n=n, pendings=p) for n, p in enumerate(later))
    return STEP.format(slots=slots, pendings=pendings, later=text)


def test_a_dot_in_flight_at_the_copy_is_the_race():
    """Session 19's kernels: a one-slot buffer at 2 stages, its dot's wait leaving it pending."""
    assert in_flight_dots(step(pendings=1), stages=2) == [Finding(8, 1, retired=False)]


@pytest.mark.parametrize(("pendings", "later"), [(0, ()), (1, (1,)), (2, (3, 2))])
def test_a_dot_retired_before_the_copy_is_not(pendings, later):
    """Waited at once, or enough later dots issued before a wait with that many pending (the
    D 256 slot-input kernels: 32 later dots and `pendings = 32`)."""
    assert in_flight_dots(step(pendings=pendings, later=later), stages=2) == [
        Finding(8, 1, retired=True)]


def test_too_few_later_dots_leave_it_in_flight():
    assert in_flight_dots(step(pendings=2, later=(2,)), stages=2) == [Finding(8, 1, False)]


def test_a_buffer_with_a_slot_a_stage_is_not_flagged():
    assert in_flight_dots(step(slots=2, pendings=1), stages=2) == []
    assert in_flight_dots(step(slots=2, pendings=1), stages=3) == [Finding(8, 2, False)]


def test_names_reused_by_a_sibling_region_are_told_apart():
    """The branches of an `scf.if` reuse SSA names: %x viewing the one-slot buffer in one
    branch must not make the other branch's %x (a loaded value) a view of it."""
    lines = step(pendings=1).splitlines()
    loop_body = lines[4:10]  # %x … the copy into %x (lines 5-10)
    other = ["    %x = tt.load %ptr : t",
             "    %d = ttng.warp_group_dot %x, %k, %a {isAsync = true} : t",
             "    %c = ttg.async_copy_global_to_local %ptr, %x mask %m : t"]
    text = "\n".join(lines[:4] + ["    scf.if %p {"] + loop_body + ["    } else {"] + other
                     + ["    }"] + lines[10:])
    assert in_flight_dots(text, stages=2) == [Finding(9, 1, retired=False)]


def test_capture_writes_each_kernels_ir_and_launch(tmp_path, monkeypatch):
    """The fwd+bwd of a Pallas op lowered for CUDA on the CPU: one TTIR file a kernel, in
    order, with the kernel's warps and stages."""
    from pallas_kernels import target
    from pallas_kernels.rms_norm.api import rms_norm

    monkeypatch.setattr(target, "platform", lambda: "gpu")
    x, w = triton_races._spec(64, 256), triton_races._spec(256, dtype=jnp.float32)
    paths = triton_races.capture(rms_norm, [x, w], tmp_path)
    assert [p.name for p in paths] == ["00_rms_norm_forward.ttir", "01_rms_norm_backward.ttir"]
    assert all("tt.func" in p.read_text() for p in paths)
    launch = json.loads(paths[1].with_suffix(".json").read_text())
    assert set(launch) == {"num_warps", "num_stages"} and launch["num_stages"] >= 1


def test_every_case_names_a_callable_and_its_inputs():
    for name, case in triton_races._cases().items():
        fn, args = case()
        assert callable(fn) and args, name
