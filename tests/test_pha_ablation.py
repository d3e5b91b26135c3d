"""experiments/pha_ablation.py end to end on CPU: `prepare` (shards copied, a BPE trained) and
`run --tiny` (the variants' -tiny presets, a few steps): table, perplexities, mixing heat map."""

import json
import lzma
import math

import pytest

from experiments import pha_ablation
from experiments.configs.pha import VARIANTS, ablation_experiment
from hybrid_jax.data.text import corpus_texts
from hybrid_jax.data.tokenizer import train_bpe

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


def test_tiny_ablation_driver_smoke(tmp_path, monkeypatch):
    """The cheapest variant end to end (the heat map of a pha run: the slow test, test_pha);
    a second call reads the finished variant's results.json instead of training it again, and
    skips an untrained one past the time limit."""
    rows = _run(tmp_path, ["attention-only"])

    def train(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(pha_ablation, "train", train)
    again = pha_ablation.run(tmp_path / "devdata", tmp_path / "out",
                             variants=["attention-only", "pha"], tiny=True, time_limit=0)
    assert again == [*rows, {"variant": "pha", "experiment": "lm-gutenberg-pha",
                             "skipped": "time limit 0 s"}]
    # Without --tiny the tiny run's results were the full variant's row (52 M tokens).
    with pytest.raises(ValueError, match=r"attention-only: made with another configuration "
                                         r"\(\['model', 'data', 'train'\] differ"):
        pha_ablation.run(tmp_path / "devdata", tmp_path / "out", variants=["attention-only"],
                         tiny=False, time_limit=0)


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


def test_row_reads_each_column_from_its_source(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({
        "params": 2_500_000, "eval_perplexity": 30.5, "eval_bits_per_byte": 1.25,
        "eval_loss": 3.4, "train_loss": 3.1, "wall_time_s": 420.0}))
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in [{"step": 1, "tokens_per_s": 5.0}, {"step": 1},
                                       {"step": 2, "tokens_per_s": 300.0},
                                       {"step": 3, "tokens_per_s": 100.0},
                                       {"step": 4, "tokens_per_s": 200.0}]))
    experiment = ablation_experiment("pha")
    train = experiment.train
    assert pha_ablation.row("pha", tmp_path, experiment) == {
        "variant": "pha", "experiment": "lm-gutenberg-pha", "params_M": 2.5,
        "eval_perplexity": 30.5, "eval_bits_per_byte": 1.25, "eval_loss": 3.4,
        "train_loss": 3.1, "tokens_per_s": 200.0,  # the first (compiling) record left out
        "tokens_M": train.steps * train.batch_size * 1024 / 1e6, "wall_s": 420.0}


def test_markdown_cells():
    rows = [{"variant": "pha", "params_M": 24.0, "eval_perplexity": 123.456,
             "eval_bits_per_byte": float("nan"), "eval_loss": 4.5, "train_loss": None,
             "tokens_per_s": 12345.6, "tokens_M": 52.4288, "wall_s": 99.99},
            {"variant": "pha-no-gss", "skipped": "time limit 420 s"}]
    assert pha_ablation.markdown(rows).splitlines()[2:] == [
        "| pha | 24.000 | 123 | – | 4.500 | – | 12,346 | 52.429 | 99.990 |",
        "| pha-no-gss | – | – | – | – | – | – | – | – |"]


def test_prepare_refuses_too_few_shards_and_trains_the_bpe_on_the_first(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    with pytest.raises(FileNotFoundError, match="expected ≥ 3 train"):
        pha_ablation.prepare(corpus, tmp_path / "three", shards=3, vocab=300)
    with pytest.raises(ValueError, match="--shards: expected at least 1, got 0"):
        pha_ablation.prepare(corpus, tmp_path / "none", shards=0, vocab=300)
    manifest = pha_ablation.prepare(corpus, tmp_path / "out", shards=2, vocab=300)
    assert manifest["tokenizer_trained_on"] == "train-00.txt.xz"
    train_bpe(corpus_texts([corpus / "train-00.txt.xz"]), 300).save(tmp_path / "first.json")
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (
        tmp_path / "first.json").read_text()


@pytest.mark.parametrize("variants, message", [
    ("pha,attention-only,pha", r"--variants: \['pha'\] given more than once"),
    ("pha,transformer", r"--variants: unknown \['transformer'\]; expected some of"),
    (",", r"--variants: expected some of \['pha', .*\], got none")])
def test_unknown_or_repeated_variants_are_refused_before_training(tmp_path, variants, message):
    """An unknown variant failed only when its turn came (after hours of the others); a
    repeated one was a second row of the same run."""
    with pytest.raises(ValueError, match=message):
        pha_ablation.main(["run", "--data", str(tmp_path), "--out", str(tmp_path / "out"),
                           "--variants", variants])
    assert not (tmp_path / "out").exists()


def test_a_finished_variant_without_its_config_is_refused(tmp_path):
    """Its results.json was read (FileNotFoundError at best) with nothing to check it against."""
    (tmp_path / "pha").mkdir()
    (tmp_path / "pha" / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="pha: holds results.json but no config.json"):
        pha_ablation.check_finished(tmp_path / "pha", ablation_experiment("pha"))
