"""PHA (block type "pha", a preset of the parallel block): mixing weights, gradients, DeepNorm
constants, reduction to one branch, and mixing introspection of a trained run.
(Decode = parallel for every PHA preset and ablation: the `-tiny` presets in test_lm.)"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj
from experiments.cli import main as cli_main
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig, TrainConfig, layer, to_dict
from hybrid_jax.context import TokenContext
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.nn.blocks import deepnorm_constants, mixing_weights
from hybrid_jax.train.mixing import mixing_weights as inspect_mixing
from hybrid_jax.train.trainer import train
from tests.helpers import assert_close, shared_model


def test_mixing_weights_are_positive_and_sum_to_one():
    rng = np.random.default_rng(0)
    for raw in [*(rng.normal(0, s, 3) for s in (0.1, 3.0, 30.0)), [-80.0, 0.0, 80.0],
                [-5.0, -5.0]]:
        w = np.asarray(mixing_weights(jnp.asarray(raw, jnp.float32)))
        assert np.all(w >= 0) and abs(w.sum() - 1) < 1e-6, raw
        assert np.all(np.diff(w[np.argsort(raw)]) >= 0), "monotone in the raw parameter"


def pha_tiny() -> hj.LanguageModel:
    """pha-tiny of seed 1, a fresh module per call (initialised, i.e. compiled, once)."""
    return shared_model(presets.get("pha-tiny"), seed=1)


def test_with_window_reaches_the_attention_branch():
    """`with_window` left PHA's attention branch (window 4 in pha-tiny) as it was and returned
    the model unchanged: a window sweep of a PHA run evaluated one model at every window. The
    changed model computes what a model built with its config computes; a model with no
    window anywhere is refused."""
    model = pha_tiny()
    changed = model.with_window(1)
    assert all(changed.config.block_options(i).branches[1].options == (("cosine", True),
                                                                        ("window", 1))
               for i in range(len(changed.config.layers)))
    assert changed.embed.table[...] is model.embed.table[...]  # parameters shared
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 8)), jnp.int32)
    logits = [m(tokens) for m in (changed, hj.create_model(changed.config, seed=1), model)]
    assert_close(logits[0], logits[1], 1e-6, "with_window(1)")
    assert float(jnp.max(jnp.abs(logits[0] - logits[2]))) > 1e-4
    with pytest.raises(ValueError, match=r"with_window: no layer has a window option \(layer "
                                         r"types \['gdn'\]\)"):
        hj.create_model(ModelConfig(layers=("gdn",), d_model=16, num_heads=2)).with_window(2)


def test_gradients_reach_every_branch_and_mixing_scalar():
    model = pha_tiny()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 9)), jnp.int32)

    def loss(model):
        return jnp.mean(jax.nn.log_softmax(model(tokens))[..., 7])

    grads = nnx.jit(nnx.grad(loss))(model)  # one compile, not one per op of the backward
    for i in range(len(model.blocks)):
        block = grads.blocks[i]
        assert block.mixing_logits[...].shape == (3,)
        assert np.all(np.abs(np.asarray(block.mixing_logits[...])) > 0), f"layer {i} mixing"
        for name in ("gss", "attention", "dual_ffn"):
            leaves = jax.tree.leaves(getattr(block, name))
            norm = sum(float(jnp.sum(jnp.abs(jnp.asarray(x)))) for x in leaves)
            assert norm > 0, f"layer {i} branch {name}"


def _deepnorm_and_pre_norm(preset: str, depth: int, **changes):
    """`depth` layers of `preset` (DeepNorm, with the block options `changes`) and the same
    with pre-norm residuals, same seed. Built eagerly: the constructor's values (create_model
    jits the same constructor), without compiling an initialisation for each of the two
    models."""
    base = presets.get(preset)
    spec = base.layers[0]
    specs = [layer(spec.type, **{**dict(spec.options), **options})
             for options in (changes, {"residual": "pre_norm"})]
    return tuple(hj.LanguageModel(base.replace(layers=(s,) * depth), rngs=nnx.Rngs(3))
                 for s in specs)


def _assert_init_gain(block, plain, path: str, gain: float) -> None:
    """The `Linear` at `path` of a DeepNorm block is Xavier-normal times `gain`: its kernel
    over the pre-norm block's (normal(init_std), same seed) is `gain·√(2/fan)/init_std`."""
    linear, base_linear = (functools.reduce(getattr, path.split("."), b) for b in (block, plain))
    fan = np.prod(linear.in_shape) + np.prod(linear.out_shape)
    ratio = linear.kernel[...] / base_linear.kernel[...]
    expected = gain * np.sqrt(2 / fan) / base_linear.init_std
    assert_close(ratio, jnp.full_like(ratio, expected), 1e-5, f"{path} (gain {gain})")


@pytest.mark.parametrize("depth", [1, 4])
def test_deepnorm_constants_follow_the_formulas(depth):
    """α = (2L)^¼ on the residual; DeepNet's init: Xavier-normal kernels, gain β = (8L)^−¼ on
    value/output/FFN up-down kernels, gain 1 on queries, keys and gates (read from parameters
    against a pre-norm model of the same seed, whose kernels are normal(init_std))."""
    model, pre_norm = _deepnorm_and_pre_norm("pha-tiny", depth)
    alpha, beta = (2 * depth) ** 0.25, (8 * depth) ** -0.25
    assert deepnorm_constants(depth) == pytest.approx((alpha, beta))
    for block, plain in zip(model.blocks, pre_norm.blocks, strict=True):
        assert block.alpha == pytest.approx(alpha) and plain.alpha == 1.0
        for path in ("attention.v_proj", "attention.o_proj", "gss.u_proj", "gss.uc_proj",
                     "gss.out_proj", "dual_ffn.primary.up", "dual_ffn.primary.down",
                     "dual_ffn.aux.up", "dual_ffn.aux.down"):
            _assert_init_gain(block, plain, path, beta)
        for path in ("attention.q_proj", "attention.k_proj", "gss.v_proj",
                     "dual_ffn.primary.gate", "dual_ffn.aux.gate"):
            _assert_init_gain(block, plain, path, 1.0)


@pytest.mark.parametrize("index,branch", [(0, "gss"), (1, "attention"), (2, "dual_ffn")])
def test_one_weight_forced_to_one_reduces_the_block_to_that_branch(index, branch):
    model = pha_tiny()
    block = model.blocks[0]
    logits = np.full(3, -1e4, np.float32)
    logits[index] = 30.0
    block.mixing_logits[...] = jnp.asarray(logits)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 7, 32)), jnp.float32)
    ctx = TokenContext.create((2, 7))
    alone = getattr(block, f"{branch}_norm")(getattr(block, branch)(x, ctx))
    expected = block.output_norm(block.alpha * x + alone)
    assert_close(block(x, ctx), expected, 1e-6, branch)


def test_the_block_is_the_softplus_weighted_sum_of_its_normed_branches():
    """Any mixing logits: output_norm(α·x + Σ_i w_i · norm_i(branch_i(x))), w = softplus(p) /
    Σ softplus(p) in numpy (one branch forced to weight 1, above, does not test the sum)."""
    model = pha_tiny()
    block = model.blocks[0]
    logits = np.asarray([0.3, -1.2, 2.0], np.float32)
    block.mixing_logits[...] = jnp.asarray(logits)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 7, 32)), jnp.float32)
    ctx = TokenContext.create((2, 7))
    softplus = np.log1p(np.exp(logits.astype(np.float64)))
    weights = softplus / softplus.sum()
    mixed = sum(w * getattr(block, f"{branch}_norm")(getattr(block, branch)(x, ctx))
                for w, branch in zip(weights, ("gss", "attention", "dual_ffn"), strict=True))
    assert_close(block(x, ctx), block.output_norm(block.alpha * x + mixed), 1e-5, "mixed")


@pytest.mark.parametrize("scan", [False, True])
def test_mixing_weights_are_logged_and_inspected(tmp_path, capsys, scan):
    """Unscanned, layer 1 logs `blocks.1.mixing_*`; scanned (groups of one block), it logs
    `blocks.0.mixing_*/1` (group 1), and `inspect mixing` names it layer 1 either way."""
    experiment = ExperimentConfig(
        name="pha-mixing-test",
        model=presets.get("pha-tiny").replace(vocab_size=32, scan_layers=scan),
        data=MQARConfig(vocab_size=32, seq_len=16, num_kv_pairs=2),
        # One device: the mixing logs do not depend on the mesh (test_sharding covers meshes),
        # and an 8-device mesh compiles and checkpoints for 8.
        train=TrainConfig(steps=2, batch_size=8, log_every=1, warmup_steps=0,
                          mesh=MeshConfig(data=1)))
    train(experiment, tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    key = "diag/blocks.0.mixing_{}/1" if scan else "diag/blocks.1.mixing_{}"
    logged = [r for r in records if key.format("attention") in r]
    assert [r["step"] for r in logged] == [1, 2]
    weights = [logged[-1][key.format(b)] for b in ("attention", "dual_ffn", "gss")]
    assert abs(sum(weights) - 1) < 1e-5 and weights != [1 / 3] * 3  # trained away from equal
    assert cli_main(["inspect", "mixing", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mixing weights at step 2" in out and "dual_ffn" in out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["1"])
    assert [float(w) for w in row[1:]] == pytest.approx(weights, abs=1e-4)
    assert (tmp_path / "mixing.png").stat().st_size > 1000
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert cli_main(["inspect", "mixing", str(tmp_path)]) == 2
    assert "no mixing weights" in capsys.readouterr().err


def test_scanned_mixing_keys_are_numbered_by_the_runs_layer_period(tmp_path):
    """Layers `attention, gss` twice, scanned: period 2, so block i of group g is layer 2g + i
    (the trained test above has period 1, where any numbering of (i, g) agrees). The latest
    record is read, and a branch a layer does not log is NaN, not 0."""
    experiment = ExperimentConfig(
        name="mixing-period", model=ModelConfig(
            layers=("attention", "gss") * 2, vocab_size=32, d_model=16, num_heads=2, ffn_dim=32,
            scan_layers=True),
        data=MQARConfig(vocab_size=32, seq_len=16, num_kv_pairs=2), train=TrainConfig())
    (tmp_path / "config.json").write_text(json.dumps(to_dict(experiment)))
    weights = {0: (0.0, 1.0), 1: (0.1, 0.9), 2: (0.2, 0.8), 3: (0.3, None)}  # (attention, gss)
    latest = {f"diag/blocks.{index % 2}.mixing_{branch}/{index // 2}": w
              for index, pair in weights.items()
              for branch, w in zip(("attention", "gss"), pair, strict=True) if w is not None}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 4, **{k: 0.5 for k in latest}}, {"step": 8, "loss": 1.0, **latest})))
    step, layers, branches, table = inspect_mixing(tmp_path)
    assert (step, layers, branches) == (8, [0, 1, 2, 3], ["attention", "gss"])
    np.testing.assert_array_equal(table, [[0.0, 1.0], [0.1, 0.9], [0.2, 0.8], [0.3, np.nan]])


def test_scanned_mixing_keys_need_the_runs_config_and_look_alike_keys_are_not_weights(
        tmp_path):
    """A scanned key (`/g`) without the run's config.json is refused, naming the file; a key
    that only begins like a mixing weight (`.../0/norm`) is not one."""
    write = lambda record: (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    write({"step": 3, "diag/blocks.0.mixing_gss/1": 0.5})
    with pytest.raises(ValueError, match="layer numbers need the run's config.json, which is "
                                         "missing"):
        inspect_mixing(tmp_path)
    write({"step": 3, "diag/blocks.0.mixing_gss": 0.5, "diag/blocks.1.mixing_gss/0/norm": 9.0})
    step, layers, branches, table = inspect_mixing(tmp_path)
    assert (step, layers, branches, table.tolist()) == (3, [0], ["gss"], [[0.5]])


def test_presets_have_the_papers_sizes():
    for name, paper in (("pha-90m", 90e6), ("pha-125m", 125e6), ("pha-180m", 180e6),
                        ("attention-only-180m", 180e6)):
        model = nnx.eval_shape(lambda name=name: hj.LanguageModel(presets.get(name),
                                                                   rngs=nnx.Rngs(0)))
        assert abs(hj.count_params(model) / paper - 1) < 0.02, name
        if name.startswith("pha"):  # the module docstring's branch sizes, finer than the count
            block, d = model.blocks[0], presets.get(name).d_model
            assert block.gss.lambda_log_im.shape == (64,), "64 complex modes"
            assert block.gss.v_proj.kernel.shape == (d, 2 * d), "gate width 2·d_model"
            assert block.gss.u_proj.kernel.shape == (d, d // 4), "DSS width d_model/4"
            assert block.attention.cosine, "scaled-cosine attention"


def test_explicit_deepnorm_constants_replace_the_formulas():
    """`deepnorm_alpha` / `deepnorm_beta` set the residual's α and the init gain β of the
    value projection (against a pre-norm model of the same seed)."""
    model, pre_norm = _deepnorm_and_pre_norm("pha-tiny", 1, deepnorm_alpha=0.7,
                                             deepnorm_beta=0.3)
    block, plain = model.blocks[0], pre_norm.blocks[0]
    assert (block.alpha, block.beta) == (0.7, 0.3)
    _assert_init_gain(block, plain, "attention.v_proj", 0.3)


@pytest.mark.parametrize("depth", [1, 3])
def test_deepnorm_counts_the_sublayers_of_a_serial_stack(depth):
    """pha-sequential has 3 post-norm residuals per layer: DeepNet's α = (3L)^¼ and
    β = (12L)^−¼ (its 3-sublayer decoder formulas), not the 2-sublayer (2L)^¼ (read from the
    initialised block and its value projection against a pre-norm model of the same seed)."""
    model, pre_norm = _deepnorm_and_pre_norm("pha-sequential-tiny", depth)
    alpha, beta = (3 * depth) ** 0.25, (12 * depth) ** -0.25
    assert deepnorm_constants(depth, 3) == pytest.approx((alpha, beta))
    for block, plain in zip(model.blocks, pre_norm.blocks, strict=True):
        assert block.alpha == pytest.approx(alpha) and block.beta == pytest.approx(beta)
        _assert_init_gain(block, plain, "attention.v_proj", beta)
