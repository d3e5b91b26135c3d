"""Data-parallel, FSDP and tensor-parallel meshes on 8 fake CPU devices give the one-device loss
and gradients, and parameters are laid out as the logical-axis rules say."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig, TrainConfig
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.sharding import (
    LOGICAL_AXIS_RULES,
    axis_rules,
    batch_sharding,
    check_batch_split,
    constrain,
    logical_to_spec,
    make_mesh,
    use_rules,
    variable_sharding,
)
from hybrid_jax.train.loss import mean_loss, token_stats
from hybrid_jax.train.trainer import init_train_state, to_device
from tests.helpers import assert_close

EXPERIMENT = ExperimentConfig(
    name="sharding-test",
    model=ModelConfig(layers=("attention", "attention"), vocab_size=64, d_model=32, num_heads=4,
                      num_kv_heads=2, ffn_dim=64),
    data=MQARConfig(vocab_size=64, seq_len=16, num_kv_pairs=2),
    train=TrainConfig(batch_size=8, steps=1, warmup_steps=0),
)


def _batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (8, 16)).astype(np.int32)
    return {"inputs": tokens, "targets": np.roll(tokens, -1, 1), "mask": np.ones((8, 16), bool)}


@functools.cache
def loss_and_grads(mesh_config: MeshConfig):
    mesh = make_mesh(mesh_config)
    ts = init_train_state(EXPERIMENT, mesh)
    model_graphdef, model_state = nnx.split(ts.model())

    @jax.jit
    def f(state, batch):
        def loss(state):
            logits = nnx.merge(model_graphdef, state)(batch["inputs"])
            return mean_loss(token_stats(logits, batch["targets"], batch["mask"]))
        return jax.value_and_grad(loss)(state)

    with jax.set_mesh(mesh):
        loss, grads = f(model_state, to_device(_batch(), mesh))
    return ts, jax.device_get(loss), jax.device_get(grads)


MESHES = [MeshConfig(data=8), MeshConfig(data=1, fsdp=8), MeshConfig(data=4, tensor=2),
          MeshConfig(data=2, fsdp=2, tensor=2)]


@pytest.mark.parametrize("mesh_config", MESHES, ids=lambda m: f"d{m.data}f{m.fsdp}t{m.tensor}")
def test_mesh_matches_single_device(mesh_config):
    _, ref_loss, ref_grads = loss_and_grads(MeshConfig(data=1))
    _, loss, grads = loss_and_grads(mesh_config)
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    assert_close(grads, ref_grads, 1e-5, "grads")


def test_parameters_are_sharded_by_the_rules():
    ts, _, _ = loss_and_grads(MeshConfig(data=2, fsdp=2, tensor=2))
    model, optimizer = nnx.merge(ts.graphdef, ts.state)
    q = model.blocks[0].mixer.q_proj.kernel[...]  # [embed=32, heads=4, head_dim=8]
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (16, 2, 8)
    down = model.blocks[1].ffn.down.kernel[...]  # [mlp=64, embed=32]
    assert down.sharding.spec == P("tensor", "fsdp")
    assert model.embed.table[...].sharding.spec == P("tensor", "fsdp")
    assert model.final_norm.scale[...].sharding.spec == P(None)
    # Adam moments follow their parameters (FSDP shards optimizer state too).
    mu = optimizer.opt_state[1][0].mu["blocks"][0]["mixer"]["q_proj"]["kernel"][...]
    assert mu.sharding.spec == P("fsdp", "tensor", None)


def test_indivisible_dimension_stays_replicated():
    mesh = make_mesh(MeshConfig(data=1, tensor=8))
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), (32, 2, 8), mesh) == P(None, None,
                                                                                      None)
    assert logical_to_spec(("embed", "heads", "head_dim"), (32, 8, 8), mesh) == P(None, "tensor",
                                                                                   None)
    with pytest.raises(ValueError, match="logical axis 'bogus' has no rule"):
        logical_to_spec(("bogus",))


def test_batch_is_split_over_data_axes():
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    batch = to_device(_batch(), mesh)
    assert batch["inputs"].sharding.spec == P(("data", "fsdp"), None)
    assert batch["inputs"].addressable_shards[0].data.shape == (1, 16)
    assert jnp.array_equal(batch["inputs"], _batch()["inputs"])


def test_rule_set_chosen_by_config():

    assert axis_rules(MeshConfig()) == dict(LOGICAL_AXIS_RULES)
    rules = axis_rules(MeshConfig(axis_rules="replicated",
                                  axis_rule_overrides=("mlp=tensor+fsdp", "vocab=none")))
    assert rules["embed"] is None and rules["mlp"] == ("tensor", "fsdp") and rules["vocab"] is None
    with use_rules(rules):
        assert logical_to_spec(("embed", "mlp")) == P(None, ("tensor", "fsdp"))
    assert logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")  # default back
    with pytest.raises(ValueError, match="unknown axis rule set 'nope'"):
        axis_rules(MeshConfig(axis_rules="nope"))
    with pytest.raises(ValueError, match="'logical=axis"):
        axis_rules(MeshConfig(axis_rule_overrides=("embd=fsdp",)))
    with pytest.raises(ValueError, match="mesh axis 'model' is not one of"):
        axis_rules(MeshConfig(axis_rule_overrides=("embed=model",)))
    # Passed, then failed in every NamedSharding of the dimension as a DuplicateSpecError.
    with pytest.raises(ValueError, match=r"rule 'mlp' -> \('tensor', 'tensor'\): names a mesh "
                                         "axis twice"):
        axis_rules(MeshConfig(axis_rule_overrides=("mlp=tensor+tensor",)))


def test_replicated_rule_set_keeps_the_batch_split():
    """The "replicated" set replicates every parameter dimension but still splits the batch
    over both data-parallel axes (FSDP devices then act as plain data parallelism): on a
    data × fsdp mesh the batch is split 8 ways, and a kernel is whole on every device."""
    rules = axis_rules(MeshConfig(axis_rules="replicated"))
    assert rules == {**{name: None for name in LOGICAL_AXIS_RULES}, "batch": ("data", "fsdp")}
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    with use_rules(rules):
        assert batch_sharding(mesh).spec == P(("data", "fsdp"), None)
        assert logical_to_spec(("embed", "mlp"), (32, 64), mesh) == P(None, None)


def test_variable_logical_axes_must_name_every_dimension():
    """`logical_axes` one short of the shape would leave the last dimension silently
    replicated (a missed `mlp`/`embed` name in a new module): refused, naming the variable;
    a variable without `logical_axes` is replicated."""
    mesh = make_mesh(MeshConfig(data=1, tensor=8))
    named = nnx.Param(jnp.zeros((8, 4)), logical_axes=("mlp", None))
    assert variable_sharding(named, mesh).spec == P("tensor", None)
    assert variable_sharding(nnx.Param(jnp.zeros((8, 4))), mesh).spec == P(None, None)
    with pytest.raises(ValueError, match=r"logical_axes \('mlp',\) do not match the shape "
                                         r"\(8, 4\) of a Param"):
        variable_sharding(nnx.Param(jnp.zeros((8, 4)), logical_axes=("mlp",)), mesh)


def test_the_default_table_places_each_activation_and_kv_axis():
    """Without a mesh the spec is the table's: the batch over both data-parallel axes, time
    over `seq` (context parallelism), KV heads and MLP units over `tensor`, head dims
    replicated."""
    assert logical_to_spec(("batch", "seq", "kv_heads", "head_dim")) == P(
        ("data", "fsdp"), "seq", "tensor", None)
    assert logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")


def test_a_mesh_axis_shards_one_dimension_at_most():
    """Two names mapped to the same mesh axis: the first dimension takes it, the second stays
    replicated (a mesh axis cannot split two dimensions of one array); size-1 mesh axes are
    left out of the spec."""
    rules = axis_rules(MeshConfig(axis_rule_overrides=("mlp=fsdp+tensor",)))
    assert rules["mlp"] == ("fsdp", "tensor")
    assert logical_to_spec(("embed", "mlp"), rules=rules) == P("fsdp", "tensor")
    assert logical_to_spec(("batch", "embed"), rules=rules) == P(("data", "fsdp"), None)
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    assert logical_to_spec(("batch", "embed", "mlp"), (8, 8, 8), mesh, rules) == P(
        "fsdp", None, "tensor")


def test_overrides_take_one_axis_as_a_name_and_an_empty_one_as_none():
    rules = axis_rules(MeshConfig(axis_rule_overrides=("mlp=fsdp", "vocab=", "heads= none")))
    assert rules["mlp"] == "fsdp" and rules["vocab"] is None and rules["heads"] is None
    for bad in ("embed", "embeddings=fsdp"):  # no "=", a name without a rule
        with pytest.raises(ValueError, match=rf"axis_rule_overrides: '{bad}' must be "
                                             r"'logical=axis\[\+axis\]' or 'logical=none'"):
            axis_rules(MeshConfig(axis_rule_overrides=(bad,)))


def test_batch_sharding_follows_the_active_rules():
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    with use_rules({**LOGICAL_AXIS_RULES, "batch": "fsdp"}):
        assert batch_sharding(mesh, 3).spec == P("fsdp", None, None)
    assert batch_sharding(mesh, 3).spec == P(("data", "fsdp"), None, None)


def test_mesh_takes_the_first_devices():
    mesh = make_mesh(MeshConfig(data=2, fsdp=1))
    assert mesh.shape == {"data": 2, "fsdp": 1, "seq": 1, "tensor": 1}
    assert list(mesh.devices.flat) == jax.devices()[:2]


def test_a_multiprocess_default_mesh_takes_every_device(monkeypatch):
    """The first 2 of 8 devices would all be process 0's, leaving process 1 none to feed."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"a job of 2 processes trains on all 8 devices \(each "
                                         r"process feeds its own\), but the mesh \{'data': 2, "
                                         r"'fsdp': 1, 'seq': 1, 'tensor': 1\} takes 2: choose "
                                         r"train.mesh sizes whose product is 8"):
        make_mesh(MeshConfig(data=2, fsdp=1))
    assert make_mesh(MeshConfig(data=-1, tensor=2)).devices.size == 8
    assert make_mesh(MeshConfig(data=2), jax.devices()[:2]).devices.size == 2  # chosen devices


def test_constrain_lays_out_activations_by_their_names():
    """Under a mesh, `constrain` pins a jitted value's layout by logical names (an array
    placed replicated comes out split as the rules say); inside a `shard_map` manual over
    every axis it is a no-op, the value already per device."""
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    x = jnp.arange(64.0).reshape(8, 8)
    with jax.set_mesh(mesh):
        y = jax.jit(lambda x: constrain(x * 2, ("batch", "mlp")))(x)
        assert y.sharding.spec == P(("data", "fsdp"), "tensor")
        inside = jax.jit(jax.shard_map(lambda x: constrain(x * 2, ("batch", "mlp")),
                                       in_specs=P(), out_specs=P(), check_vma=False))(x)
    np.testing.assert_array_equal(y, 2 * x)
    np.testing.assert_array_equal(inside, 2 * x)


def test_axes_made_manual_by_a_shard_map_are_left_out():
    """Inside a `shard_map` manual over `tensor` only, a constraint names the other axes but
    not `tensor` (each device holds its tensor shard already)."""
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    seen = []

    def body(x):
        seen.append(logical_to_spec(("batch", "mlp"), x.shape, jax.sharding.get_abstract_mesh()))
        return constrain(x, ("batch", "mlp"))

    with jax.set_mesh(mesh):
        jax.jit(jax.shard_map(body, in_specs=P(None, "tensor"), out_specs=P(None, "tensor"),
                              axis_names={"tensor"}))(jnp.ones((8, 8)))
    assert seen == [P(("data", "fsdp"), None)]


def test_a_variable_without_logical_axes_is_replicated_on_every_axis():
    mesh = make_mesh(MeshConfig(data=1, fsdp=8))
    assert variable_sharding(nnx.Param(jnp.zeros((8, 8))), mesh).spec == P(None, None)


def test_a_sequence_the_seq_axis_cannot_split_is_refused_by_name():
    """A run on 4 seq devices with data.seq_len=18 is refused before anything compiles; the
    context-parallel ops' error came once the model was traced and named an activation's
    shape, not the setting."""
    from hybrid_jax.train.trainer import train

    experiment = dataclasses.replace(
        EXPERIMENT, data=dataclasses.replace(EXPERIMENT.data, seq_len=18),
        train=dataclasses.replace(EXPERIMENT.train, mesh=MeshConfig(data=2, seq=4)))
    with pytest.raises(ValueError, match=r"^data.seq_len=18 does not split over the mesh's 4 "
                                         r"'seq' devices \(context parallelism\): use a "
                                         r"multiple of 4"):
        train(experiment, progress=False)


def test_a_batch_is_refused_unless_the_batch_axes_divide_it():
    """6 rows are more than the 4 data x fsdp shards and still refused; 8 split into 4."""
    mesh = make_mesh(MeshConfig(data=2, fsdp=2), jax.devices()[:4])
    check_batch_split(mesh, 8)
    with pytest.raises(ValueError, match=r"train.batch_size=6 does not split over the mesh's "
                                         r"batch axes \(data 2 x fsdp 2 = 4 shards\): use a "
                                         r"multiple of 4"):
        check_batch_split(mesh, 6)


def test_training_places_its_batches_by_the_runs_batch_rule():
    """The prefetch thread placed batches by the default table (`use_rules` holds per thread):
    with `batch=data`, one row on data 1 x fsdp 2 was split in two, and JAX refused it."""
    from hybrid_jax.train.trainer import train

    mesh = MeshConfig(data=1, fsdp=2, axis_rule_overrides=("batch=data",))
    experiment = dataclasses.replace(
        EXPERIMENT, model=EXPERIMENT.model.replace(layers=("attention",)),
        train=dataclasses.replace(EXPERIMENT.train, batch_size=1, eval_batches=1, mesh=mesh))
    assert train(experiment, progress=False)["steps"] == 1


def test_a_model_runs_under_a_callers_mesh_of_data_alone():
    """A caller's own mesh (coming from pmap: `jax.make_mesh((2,), ("data",), axis_types=
    (AxisType.Auto,))`): the constraints named the rule table's axes it lacks (KeyError
    'fsdp'); they leave them out, and the logits are one device's."""
    from hybrid_jax import create_model

    graphdef, state = nnx.split(create_model(EXPERIMENT.model.replace(layers=("attention",)),
                                             seed=0))
    forward = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
    tokens = _batch()["inputs"][:2]
    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        logits = forward(state, jax.device_put(tokens, P("data")))
    assert_close(logits, forward(state, tokens), 1e-6, "logits")
