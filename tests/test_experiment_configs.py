"""The registered experiments (experiments/configs/*.py) hold what their descriptions and
docstrings say: data, lengths, vocabularies, steps, schedules, chunks, windows and sizes."""

import dataclasses
import re

import pytest
from flax import nnx

import hybrid_jax as hj
from experiments import registry
from experiments.configs import lm, oryx, pha
from hybrid_jax import presets
from hybrid_jax.config import ModeSchedule


def _count(model) -> float:
    """Parameters in millions (abstract build)."""
    return hj.count_params(nnx.eval_shape(lambda: hj.LanguageModel(model, rngs=nnx.Rngs(0)))) / 1e6


def _claims(description: str):
    """(regex, value of the experiment it names) pairs a description can make."""
    return [
        (r"\((\d+) pairs", lambda e: e.data.num_kv_pairs),
        (r"length (\d+)\)", lambda e: e.data.seq_len),
        (r"vocab (\d+)", lambda e: e.data.vocab_size),
        (r"(\d+) steps", lambda e: e.train.steps),
        (r"^(\d+)-layer", lambda e: len(e.model.layers)),
        (r"(\d+) slots", lambda e: e.model.block_options(0).num_slots),
        (r"\((\d+) x \d+\)", lambda e: len(e.model.layers)),
        (r"\(\d+ x (\d+)\)", lambda e: e.model.d_model),
        (r"(\d+)-token chunk", lambda e: e.train.mode_schedule.chunk),
        (r"sliding-window \((\d+)\)", lambda e: e.model.block_options(0).window),
        (r"^[^+]*\bwindow (\d+)", lambda e: e.model.block_options(0).window),
        (r"(\d+) needles in a", lambda e: e.data.num_needles),
        (r"a (\d+)-token haystack", lambda e: e.data.seq_len),
        (r"T (\d+)", lambda e: e.data.seq_len),
        (r"d_model (\d+)", lambda e: e.model.d_model),
        (r"(\d+) blocks", lambda e: len(e.model.layers)),
        (r"BPE (\d+)", lambda e: int(e.data.tokenizer.removeprefix("bpe:"))),
        (r"(\d+)k BPE", lambda e: int(e.data.tokenizer.removeprefix("bpe:")) // 1000),
        (r"on a (\d+)-token needle", lambda e: e.data.seq_len),
    ]


@pytest.mark.parametrize("name", registry.names())
def test_descriptions_say_what_the_experiment_is(name):
    experiment = registry.get(name)
    description = experiment.description
    said = 0
    for pattern, value in _claims(description):
        match = re.search(pattern, description)
        if match:
            assert value(experiment) == int(match.group(1)), (name, pattern)
            said += 1
    if "byte-level" in description:
        assert experiment.data.tokenizer == "byte" and experiment.model.vocab_size == 257
    if "mixed mode" in description or description.startswith("Oryx"):
        assert experiment.train.mode_schedule.pattern == "random_chunks", name
    if name.startswith(("mqar", "needle", "lm-")) and "baseline" not in name:
        assert said, f"{name}: its description names no size"


@pytest.mark.parametrize("name", registry.names())
def test_models_cover_their_data(name):
    """The model's vocabulary is the tokenizer's (a BPE's size; 256 bytes + the end-of-document
    token) or holds the task's tokens; the Oryx runs and their baselines use the task's."""
    experiment = registry.get(name)
    data, vocab = experiment.data, experiment.model.vocab_size
    tokenizer = getattr(data, "tokenizer", None)
    if tokenizer == "byte":
        assert vocab == 257
    elif tokenizer:
        assert vocab == int(tokenizer.removeprefix("bpe:"))
    else:
        assert vocab >= data.vocab_size
        if "oryx" in name or "baseline" in name:
            assert vocab == data.vocab_size


def test_the_lm_experiments_data_and_schedules():
    article = re.compile(lm.WIKITEXT_ARTICLE, re.M)
    text = " = Valkyria Chronicles III = \n\n = = Gameplay = = \n text \n = Tower Building = \n"
    assert article.findall(text) == [" = Valkyria Chronicles III = ", " = Tower Building = "]
    for name in ("lm-gutenberg-nha-hybrid-1b", "lm-gutenberg-transformer-1b"):
        experiment = registry.get(name)
        assert experiment.model.replace(dtype="float32", scan_layers=False, remat="none") == \
            presets.get(name.removeprefix("lm-gutenberg-"))
        assert (experiment.model.dtype, experiment.model.scan_layers, experiment.model.remat) \
            == ("bfloat16", True, "full")
        mesh = experiment.train.mesh
        assert (mesh.data, mesh.fsdp) == (1, -1), "parameters sharded over every device"
        assert experiment.data.path.endswith("gutenberg/train-*.txt.xz")
    llama = registry.get("lm-gutenberg-llama-40m")
    assert llama.data.path.endswith("gutenberg/train-0[0-3].txt.xz"), "4 shards"
    assert llama.model.replace(dtype="float32", scan_layers=False) == presets.get("llama-40m")
    for name in ("lm-wikitext2-transformer-125m", "lm-gutenberg-transformer-125m"):
        model = registry.get(name).model
        assert model == presets.get("transformer-125m").replace(vocab_size=32768,
                                                                dtype="bfloat16")


@pytest.mark.parametrize("name, seq_len, steps, batch, lr, warmup", [
    ("lm-wikitext2-transformer-tiny", 256, 600, 16, 3e-3, 50),
    ("lm-gutenberg-transformer-tiny", 256, 600, 16, 3e-3, 50),
    ("lm-wikitext2-nha-tiny", 256, 600, 16, 3e-3, 50),
    ("lm-wikitext2-transformer-125m", 1024, 1000, 16, 6e-4, 500),
    ("lm-gutenberg-transformer-125m", 1024, 5000, 32, 6e-4, 500),
    ("lm-gutenberg-llama-40m", 1024, 1500, 32, 1e-3, 100),
    ("lm-gutenberg-transformer-1b", 2048, 5000, 32, 3e-4, 500),
    ("lm-wikitext2-oryx-gdn-tiny", 256, 500, 16, 3e-3, 50),
    ("lm-wikitext2-oryx-gdn-small", 512, 400, 32, 2e-3, 40),
])
def test_the_lm_schedules(name, seq_len, steps, batch, lr, warmup):
    """The row length and schedule each language-modelling run was recorded with."""
    experiment = registry.get(name)
    train = experiment.train
    assert (experiment.data.seq_len, train.steps, train.batch_size, train.learning_rate,
            train.warmup_steps, train.weight_decay) == (seq_len, steps, batch, lr, warmup, 0.1)


def test_mqar_experiments_train_their_named_preset():
    """`mqar-<preset>` trains the preset; the main job is the Gated DeltaNet + attention hybrid;
    the mqar4 GSA model is the NHA model with window 0 and the sliding-window baseline has
    NHA's 4 kv heads."""
    for name in registry.names():
        preset = name.removeprefix("mqar-")
        if name.startswith("mqar-") and preset in presets.names():
            assert registry.get(name).model == presets.get(preset), name
    hybrid = registry.get("mqar-hybrid-tiny")
    assert hybrid.model == presets.get("gdn-hybrid-tiny") and hybrid.train.steps == 800
    assert registry.get("mqar-transformer-tiny").train.steps == 1500
    nha4, gsa4 = registry.get("mqar4-nha-tiny"), registry.get("mqar4-gsa-tiny")
    assert gsa4.model == nha4.model.replace(window=0) and nha4.model.window == 16
    assert gsa4.train == nha4.train and gsa4.data == nha4.data
    for name in ("mqar-swa-tiny", "mqar4-swa-tiny"):
        model = registry.get(name).model
        assert (model.kv_heads, model.window) == (4, 16), name
        assert model.replace(num_kv_heads=2) == presets.get("swa-transformer-tiny"), name
    # experiments/README.md: the mqar4 comparison's schedule
    train = nha4.train
    assert (train.steps, train.batch_size, train.learning_rate, train.min_lr_ratio) == (
        4000, 64, 3e-3, 0.1)


def test_oryx_experiments_schedules():
    """Modes drawn per 16-token chunk with attention probability 0.5 (32-token chunks for the
    tiny LM, 64 for the small one); the 4-pair MQAR and the needles at a constant 3e-3 after
    warmup."""
    assert oryx.MIXED == ModeSchedule(pattern="random_chunks", chunk=16, attention_prob=0.5)
    for name, chunk in (("mqar-oryx-gdn-tiny", 16), ("mqar4-oryx-gdn-tiny", 16),
                        ("needle-oryx-gdn-tiny", 16), ("needle8-oryx-gdn-tiny", 16),
                        ("lm-wikitext2-oryx-gdn-tiny", 32), ("lm-wikitext2-oryx-gdn-small", 64)):
        schedule = registry.get(name).train.mode_schedule
        assert schedule == dataclasses.replace(oryx.MIXED, chunk=chunk), name
    for name, steps in (("mqar4-oryx-gdn-tiny", 1000), ("needle-oryx-gdn-tiny", 200),
                        ("needle8-oryx-gdn-tiny", 600)):
        train = registry.get(name).train
        assert (train.steps, train.learning_rate, train.min_lr_ratio) == (steps, 3e-3, 1.0)
    assert registry.get("needle8-oryx-gdn-tiny").data.num_keys == 16
    small = registry.get("lm-wikitext2-oryx-gdn-small")
    assert round(_count(small.model)) == 22, "~22M parameters"
    assert small.model.dtype == "bfloat16" and small.data.seq_len == 512


def test_oryx_baselines_have_their_documented_sizes():
    """On the needle vocabulary: oryx-gdn-tiny 0.128M; the baselines 0.109M (2 attention
    layers), 0.120M (2 GDN layers of Oryx's value width, expand_v 1), 0.115M (4 Mamba-2)."""
    vocab = registry.get("needle-oryx-gdn-tiny").model.vocab_size
    assert round(_count(registry.get("needle-oryx-gdn-tiny").model), 3) == 0.128
    sizes = {preset: round(_count(model().replace(vocab_size=vocab)), 3)
             for preset, model in oryx.BASELINES.items()}
    assert sizes == {"transformer-tiny": 0.109, "gdn-tiny": 0.120, "mamba2-tiny": 0.115}
    gdn = registry.get("needle-baseline-gdn-tiny").model
    assert all(gdn.block_options(i).expand_v == 1 for i in range(len(gdn.layers)))


def test_pha_ablation_models_have_their_documented_sizes():
    """experiments/configs/pha.py: parameters (tied embeddings included) pha 29.0 M,
    pha-sequential 29.0 M, pha-no-attention 25.0 M, pha-no-gss 21.8 M, attention-only 29.2 M;
    bf16, scanned layers, 2 key/value heads of 64."""
    sizes = {variant: round(_count(pha.ablation_model(variant)), 1) for variant in
             ("pha", "pha-sequential", "pha-no-attention", "pha-no-gss", "attention-only")}
    assert sizes == {"pha": 29.0, "pha-sequential": 29.0, "pha-no-attention": 25.0,
                     "pha-no-gss": 21.8, "attention-only": 29.2}
    for variant in pha.VARIANTS:
        model = pha.ablation_model(variant)
        assert (model.dtype, model.scan_layers, model.kv_heads, model.num_heads) == (
            "bfloat16", True, 2, 6), variant
    prenorm = pha.ablation_model("pha-sequential-prenorm").block_options(0)
    assert (prenorm.layout, prenorm.residual) == ("sequential", "pre_norm")
    # experiments/README.md: lr 2e-3, 80 warm-up steps, cosine to 10 %
    train = pha.ABLATION_TRAIN
    assert (train.learning_rate, train.warmup_steps, train.min_lr_ratio, train.steps) == (
        2e-3, 80, 0.1, 800)
    assert pha.ABLATION_DATA.path.count(",") == 3, "the first four shards"
    with pytest.raises(ValueError, match=r"unknown PHA ablation variant 'pha-no-ffn-aux'; "
                                         r"expected one of \['pha'"):
        pha.ablation_model("pha-no-ffn-aux")
