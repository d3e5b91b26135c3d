"""`profile_step --kernel-changes`: each mode is profiled with the kernels' default tiles
changed, restored afterwards, and the JSON records the changes (the profile itself is
stubbed: its CPU run is the pha_efficiency tests')."""

from __future__ import annotations

import json
import sys

from experiments.benchmarks import profile_step


def test_kernel_changes_reach_every_mode_and_the_json(tmp_path, monkeypatch):
    from pallas_kernels.ssd import api

    original, seen = api.default_block_sizes, []

    def fake_profile(args, mode, trace_dir):
        seen.append((mode, api.default_block_sizes(64, 128)))
        return {"mode": mode, "step_ms": 1.0, "device_ms_per_step": 1.0, "categories": [],
                "kernels": []}

    monkeypatch.setattr(profile_step, "profile_mode", fake_profile)
    monkeypatch.setattr(profile_step, "differences", lambda profiles, top: [])
    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["profile_step", "--modes", "packed,unpacked",
                                      "--kernel-changes", "ssd:grads_num_stages=2",
                                      "--out", str(out), "--trace-dir", str(tmp_path)])
    profile_step.main()
    assert [mode for mode, _ in seen] == ["packed", "unpacked"]
    assert all(blocks.grads_num_stages == 2 for _, blocks in seen)
    assert api.default_block_sizes is original
    assert api.default_block_sizes(64, 128).grads_num_stages == 3
    assert json.loads(out.read_text())["kernel_changes"] == {"ssd": {"grads_num_stages": 2}}
