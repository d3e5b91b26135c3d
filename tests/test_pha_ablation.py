"""experiments/pha_ablation.py end to end on CPU: `prepare` (shards copied, a BPE trained) and
`run --tiny` (the variants' -tiny presets, a few steps): table, perplexities, mixing heat map."""

import json
import lzma
import math

import pytest

from experiments import pha_ablation
from experiments.configs.pha import VARIANTS, ablation_experiment

WORDS = ("the river ran past the mill and the miller sang of bread and of rain while the "
         "children counted boats").split()


def _corpus(path, shards=2):
    path.mkdir()
    for name, seed in [*((f"train-{i:02d}.txt.xz", i) for i in range(shards)),
                       ("valid.txt.xz", 99)]:
        lines = [" ".join(WORDS[(seed + 3 * i + j) % len(WORDS)] for j in range(12))
                 for i in range(150)]
        with lzma.open(path / name, "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return path


def _run(tmp_path, variants):
    data = tmp_path / "devdata"
    manifest = pha_ablation.prepare(_corpus(tmp_path / "corpus"), data, shards=2, vocab=300)
    assert manifest["shards"] == ["train-00.txt.xz", "train-01.txt.xz"]
    assert sorted(p.name for p in data.iterdir()) == [
        "manifest.json", "tokenizer.json", "train-00.txt.xz", "train-01.txt.xz", "valid.txt.xz"]
    out = tmp_path / "out"
    assert pha_ablation.main(["run", "--data", str(data), "--out", str(out), "--tiny",
                              "--variants", ",".join(variants), "--export",
                              str(tmp_path / "export")]) == 0
    exported = tmp_path / "export"
    first = exported / variants[0]
    assert (exported / "ablation.md").is_file() and (first / "metrics.jsonl").is_file()
    assert not (first / "checkpoints").exists() and (out / variants[0] / "checkpoints").exists()
    rows = json.loads((out / "ablation.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == list(variants)
    for r in rows:
        assert math.isfinite(r["eval_perplexity"]) and 1 < r["eval_perplexity"] < 300, r
        assert r["tokens_per_s"] > 0 and r["params_M"] > 0
    assert (out / "ablation.md").read_text().count("\n") == 2 + len(variants)
    if "pha" in variants:
        assert (out / "mixing.png").stat().st_size > 1000  # the pha run's heat map
    return rows


def test_tiny_ablation_driver_smoke(tmp_path):
    """The cheapest variant end to end (the heat map of a pha run: the slow test, test_pha)."""
    _run(tmp_path, ["attention-only"])


@pytest.mark.slow
def test_tiny_ablation_driver_all_variants(tmp_path):
    rows = _run(tmp_path, list(VARIANTS))
    # Five different models; the two serial stacks differ only in their residual scheme.
    assert len({r["params_M"] for r in rows}) == len(VARIANTS) - 1


def test_registered_experiments_share_data_tokens_and_seed():
    experiments = [ablation_experiment(v) for v in VARIANTS]
    assert {e.name for e in experiments} == {
        "lm-gutenberg-pha", "lm-gutenberg-pha-sequential", "lm-gutenberg-pha-no-attention",
        "lm-gutenberg-pha-no-gss", "lm-gutenberg-pha-attention-only",
        "lm-gutenberg-pha-sequential-prenorm"}
    assert len({(e.data, e.train) for e in experiments}) == 1
    tokens = experiments[0].train.steps * experiments[0].train.batch_size * 1024
    assert tokens >= 50e6 and experiments[0].data.seq_len == 1024
    assert {(e.model.d_model, len(e.model.layers), e.model.vocab_size) for e in experiments} == {
        (384, 10, 8192)}
