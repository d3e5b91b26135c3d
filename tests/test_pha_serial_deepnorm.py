"""The serial-DeepNorm diagnosis script trains its arms end to end (tiny, on a tiny corpus)."""

from __future__ import annotations

import json
import lzma

import pytest

from experiments import pha_serial_deepnorm


@pytest.mark.slow
def test_two_arms_train_and_are_summarised(tmp_path):
    corpus = tmp_path / "data" / "gutenberg"
    corpus.mkdir(parents=True)
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                   for i in range(400))
    for name in ("train-00.txt.xz", "valid.txt.xz"):
        (corpus / name).write_bytes(lzma.compress(text.encode()))
    out = tmp_path / "out"
    assert pha_serial_deepnorm.main(["--out", str(out), "--runs",
                                     "deepnorm-subl,1e-3;prenorm,1e-3", "--d-model", "64",
                                     "--steps", "3", "--warmup", "1", "--seq-len", "16",
                                     "--batch-size", "8", "--data", str(tmp_path / "data")]) == 0
    rows = {r["arm"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert rows["deepnorm-subl"]["alpha"] == pytest.approx(30 ** 0.25)
    assert rows["prenorm"]["alpha"] is None
    assert all(r["final_train_loss"] > 0 and r["nonfinite_at_step"] is None
               for r in rows.values())
