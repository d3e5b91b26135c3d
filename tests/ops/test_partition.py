"""Every Pallas rung under a mesh (`hybrid_jax.ops.partition`), on 8 fake CPU devices with the
kernels in interpret mode (tiny tiles; the backend patched to "gpu" for the ops' checks).

* Under `data=2 × tensor=2` (and `fsdp=2 × tensor=2`) each rung's outputs and the gradients of
  every float input equal the single-device ones (float32), and the compiled program holds no
  all-gather: each device runs the kernel on its batch rows and heads only (GQA's kv heads, SSD's
  A and B/C groups, NHA's state split with them).
* With `check_vma` on (as the library runs it), every rung's forward and backward trace under
  the mesh: the kernels' out shapes and custom VJPs carry the varying mesh axes.
* Inside context parallelism (`seq=2 × data=2 × tensor=2`) the rungs nest their shard_map
  in its own (traced with `check_vma` on; values and gradients in the slow suite).
* A single group (MQA's kv head, Mamba-2's B/C group) stays whole on every device while the
  heads split (traced; values and gradients slow).
* Heads that do not divide the `tensor` axis fall back to batch-only shards, logged once.
* The row-wise kernels (the norms, the loss statistics) split the sequence over `seq` too: no
  all-gather, the single-device values, and the Triton lowering under `check_vma`.

Default suite: each rung's values on `data=2 × tensor=2` and every trace; the gradients, the
`fsdp` mesh, NHA from a state, the context-parallel runs and the benchmark's rows are `slow`.

Running (not tracing) needs the shard_maps' `check_vma` off: jax 0.10's Pallas interpreter
fails under it on any kernel with an in-kernel loop (`test_interpreter_needs_vma_off` shows it
on a three-line kernel, and fails once jax fixes that, so the workaround can go); on a GPU the
kernels lower without the interpreter.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.benchmarks import sharded_kernels
from hybrid_jax import ops
from hybrid_jax.config import MeshConfig
from hybrid_jax.ops import context_parallel as cp
from hybrid_jax.ops import dispatch, partition
from hybrid_jax.ops.nha import NHAState
from hybrid_jax.sharding import LOGICAL_AXIS_RULES, logical_to_spec, make_mesh
from pallas_kernels import target
from pallas_kernels.delta_rule import api as delta_api
from pallas_kernels.flash_attention import api as flash_api
from pallas_kernels.logit_stats import api as logit_stats_api
from pallas_kernels.nha import api as nha_api
from pallas_kernels.rms_norm import api as rms_norm_api
from pallas_kernels.short_conv import api as short_conv_api
from pallas_kernels.ssd import api as ssd_api
from tests.helpers import assert_close, kernels_in_interpret_mode, normals
from tests.pallas import (
    test_delta_rule_kernel,
    test_flash_attention,
    test_logit_stats,
    test_nha_kernel,
    test_rms_norm,
    test_short_conv,
    test_ssd_kernel,
)

OP_MODULES = ("attention", "delta_rule", "ssd")  # their pallas rungs check `backend()`
KERNELS = ((flash_api, "flash_attention", test_flash_attention.TINY),
           (delta_api, "gated_delta_rule", test_delta_rule_kernel.TINY),
           (ssd_api, "ssd", test_ssd_kernel.TINY),
           (nha_api, "native_hybrid_attention", test_nha_kernel.TINY),
           (short_conv_api, "short_conv", test_short_conv.TINY))
LOGICAL = {"B": "batch", "H": "heads", "G": "kv_heads"}
B, T = 4, 16
# Packed documents: starts on and off the kernels' 8-token chunks.
IDS = jnp.asarray(np.repeat([[0] * 5 + [1] * 3 + [2] * 8, [0] * 8 + [1] * 8], 2, axis=0),
                  jnp.int32)


@pytest.fixture
def pallas_on_cpu(monkeypatch):
    """The ops' pallas rungs run the kernels in interpret mode with tiny tiles."""
    kernels_in_interpret_mode(monkeypatch, KERNELS, OP_MODULES)


@pytest.fixture
def vma_off(monkeypatch):
    """The shard_maps of `partition` without `check_vma`, for the Pallas interpreter."""
    shard_map = jax.shard_map
    monkeypatch.setattr(jax, "shard_map",
                        lambda f, **kwargs: shard_map(f, **{**kwargs, "check_vma": False}))


def _gates(seed, shape):
    return -jnp.exp(normals(seed, shape, dtype=np.float32)) * 0.3


def attention_case(heads=4, kv_heads=2, api=ops):
    q, k, v = normals(0, (B, T, heads, 8), (B, T, kv_heads, 8), (B, T, kv_heads, 8),
                      dtype=np.float32)
    run = lambda x, ids: api.attention(x["q"], x["k"], x["v"], segment_ids=ids,
                                       implementation="pallas")
    return run, dict(q=q, k=k, v=v), dict(q="BTHD", k="BTGD", v="BTGD")


def delta_rule_case(heads=4, api=ops):
    q, k, v, beta, state = normals(1, (B, T, heads, 8), (B, T, heads, 8), (B, T, heads, 8),
                                   (B, T, heads), (B, heads, 8, 8), dtype=np.float32)
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    x = dict(q=q, k=k, v=v, g=_gates(2, (B, T, heads)), beta=jax.nn.sigmoid(beta),
             initial_state=state)
    run = lambda x, ids: api.gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
        segment_ids=ids, return_final_state=True, implementation="pallas")
    return run, x, dict(q="BTHK", k="BTHK", v="BTHV", g="BTH", beta="BTH", initial_state="BHKV")


def ssd_case(heads=4, groups=2, api=ops):
    x, dt, a, b, c = normals(3, (B, T, heads, 8), (B, T, heads), (heads,), (B, T, groups, 8),
                             (B, T, groups, 8), dtype=np.float32)
    inputs = dict(x=x, dt=0.5 * jax.nn.softplus(dt), A=-jnp.exp(0.5 * a), B=b, C=c)
    run = lambda x, ids: api.ssd(x["x"], x["dt"], x["A"], x["B"], x["C"], segment_ids=ids,
                                 return_final_state=True, implementation="pallas")
    return run, inputs, dict(x="BTHP", dt="BTH", A="H", B="BTGN", C="BTGN")


def gsa_case(heads=4, api=ops):
    q, k, v, f, keys, values = normals(4, (B, T, heads, 4), (B, T, heads, 4), (B, T, heads, 4),
                                       (B, T, heads, 4), (B, heads, 4, 4), (B, heads, 4, 4),
                                       dtype=np.float32)
    g = jax.nn.log_sigmoid(f)
    x = dict(q=q, k=k, v=v, s=1 - jnp.exp(g), g=g, state=(keys, values))
    run = lambda x, ids: api.gated_slot_attention(
        x["q"], x["k"], x["v"], x["s"], x["g"], initial_state=x["state"], segment_ids=ids,
        return_final_state=True, chunk_size=8, implementation="pallas")
    return run, x, dict(q="BTHK", k="BTHK", v="BTHV", s="BTHM", g="BTHM", state="BHKM")


def nha_case(heads=4, kv_heads=2, api=ops):
    q, k, v, f, qw, kw = normals(5, (B, T, heads, 4), (B, T, kv_heads, 4), (B, T, kv_heads, 4),
                                 (B, T, kv_heads, 4), (B, T, heads, 8), (B, T, kv_heads, 8),
                                 dtype=np.float32)
    g = jax.nn.log_sigmoid(f)
    x = dict(q=q, k=k, v=v, s=1 - jnp.exp(g), g=g, q_window=qw, k_window=kw)

    def run(x, ids):
        final = api is ops  # context parallelism's form returns the outputs only
        result = api.native_hybrid_attention(
            x["q"], x["k"], x["v"], x["s"], x["g"], window=5, q_window=x["q_window"],
            k_window=x["k_window"], segment_ids=ids, chunk_size=8, implementation="pallas",
            **dict(return_final_state=True) if final else {})
        return (result[0], result[1].slot_keys, result[1].slot_values) if final else result

    return run, x, dict(q="BTHK", k="BTGK", v="BTGV", s="BTGM", g="BTGM", q_window="BTHD",
                        k_window="BTGD")


def short_conv_case(api=ops):
    """GDN's q/k/v conv: channels along the heads (split over `tensor`), bias, SiLU."""
    x, weight, bias = normals(7, (B, T, 8), (4, 8), (8,), dtype=np.float32)
    run = lambda x, ids: api.short_conv(x["x"], x["weight"], x["bias"], segment_ids=ids,
                                        activation=True, head_channels=True,
                                        implementation="pallas")
    return run, dict(x=x, weight=weight, bias=bias), dict(x="BTH", weight="_H", bias="H")


NHA_STATE = ("BGKM", "BGMV", "BWGK", "BWGV", "BWGM", "BWGM", "BWGD")


def nha_state_case():
    """NHA continuing from a state: slots per kv head and a ring of w tokens."""
    _, x, layouts = nha_case()
    slot_keys, slot_values, keys, values, f, window_keys = normals(
        6, (B, 2, 4, 4), (B, 2, 4, 4), (B, 5, 2, 4), (B, 5, 2, 4), (B, 5, 2, 4), (B, 5, 2, 8),
        dtype=np.float32)
    g = jax.nn.log_sigmoid(f)
    x["state"] = (slot_keys, slot_values, keys, values, 1 - jnp.exp(g), g, window_keys)
    length, document_start = jnp.asarray(11, jnp.int32), jnp.asarray([0, 3, 9, 0], jnp.int32)

    def run(x, ids):
        state = NHAState(*x["state"], length, document_start)
        out, final = ops.native_hybrid_attention(
            x["q"], x["k"], x["v"], x["s"], x["g"], window=5, q_window=x["q_window"],
            k_window=x["k_window"], segment_ids=ids, initial_state=state,
            return_final_state=True, chunk_size=8, implementation="pallas")
        return out, final.slot_keys, final.slot_values

    return run, x, {**layouts, "state": NHA_STATE}


CASES = dict(attention=attention_case, gated_delta_rule=delta_rule_case, ssd=ssd_case,
             gated_slot_attention=gsa_case, native_hybrid_attention=nha_case,
             native_hybrid_attention_state=nha_state_case, short_conv=short_conv_case)
DEFAULT = {name: [] for name in CASES} | {"native_hybrid_attention_state": [pytest.mark.slow]}


def _loss_and_grads(run, x, ids):
    """Σ w·(every output) and its gradient with respect to every float input: one function."""
    shapes = jax.eval_shape(run, x, ids)
    weights = normals(9, *(s.shape for s in jax.tree.leaves(shapes)), dtype=np.float32)
    weights = [weights] if len(jax.tree.leaves(shapes)) == 1 else weights

    def loss(x, ids):
        outs = jax.tree.leaves(run(x, ids))
        return sum(jnp.sum(w * y) for w, y in zip(weights, outs, strict=True)), outs

    return jax.value_and_grad(loss, has_aux=True)


def _placed(x, layouts, mesh):
    """Inputs laid out as the model's activations are: by the logical-axis rule table."""
    def place(a, layout):
        names = [LOGICAL.get(letter) for letter in layout]
        return jax.device_put(a, NamedSharding(mesh, logical_to_spec(names, a.shape, mesh)))
    def place_tree(layout, tree):  # one layout for a tree, or one per leaf
        return jax.tree.map(lambda a: place(a, layout), tree)

    return {name: jax.tree.map(place_tree, layouts[name], x[name]) for name in x}


def _check_rung(name, mesh_config, grads):
    run, x, layouts = CASES[name]()
    fn = _loss_and_grads(run, x, IDS) if grads else run
    expected = jax.jit(fn)(x, IDS)
    mesh = make_mesh(mesh_config)
    with jax.set_mesh(mesh):
        args = (_placed(x, layouts, mesh),
                jax.device_put(IDS, NamedSharding(mesh, logical_to_spec(("batch", None)))))
        compiled = jax.jit(fn).lower(*args).compile()
        got = compiled(*args)
    assert_close(got, expected, 1e-5, f"{name} outputs" + " and gradients" * grads)
    assert "all-gather" not in compiled.as_text(), f"{name}: the sharded program gathers inputs"


MESHES = [pytest.param(MeshConfig(data=2, tensor=2), id="d2t2"),
          pytest.param(MeshConfig(data=1, fsdp=2, tensor=2), id="f2t2", marks=pytest.mark.slow)]
GRADS = [pytest.param(False, id="values"),
         pytest.param(True, id="grads", marks=pytest.mark.slow)]


@pytest.mark.parametrize("grads", GRADS)
@pytest.mark.parametrize("mesh_config", MESHES)
@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, m in DEFAULT.items()])
def test_rung_on_a_mesh_equals_one_device(pallas_on_cpu, vma_off, name, mesh_config, grads):
    _check_rung(name, mesh_config, grads)


def _count(jaxpr, name: str) -> int:
    """Equations of primitive `name` in a jaxpr and all its sub-jaxprs."""
    found = 0
    for eqn in jaxpr.eqns:
        found += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _count(inner, name)
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_rung_traces_with_check_vma(pallas_on_cpu, name):
    """Forward and backward of each rung under `data=2 × tensor=2`, `check_vma` on: traced (the
    types are checked there), the kernels inside a shard_map."""
    run, x, _ = CASES[name]()
    with jax.set_mesh(make_mesh(MeshConfig(data=2, tensor=2))):
        jaxpr = jax.make_jaxpr(_loss_and_grads(run, x, IDS))(x, IDS).jaxpr
    assert _count(jaxpr, "shard_map") >= 2  # forward and backward
    assert _count(jaxpr, "pallas_call") >= 2


def _zero_state(case):
    """`case` with its initial state left to the kernel (zeros it makes itself)."""
    run, x, layouts = case()
    return (lambda x, ids: run({**x, "initial_state": None}, ids),
            {n: a for n, a in x.items() if n != "initial_state"}, layouts)


CALLER_CASES = {name: CASES[name] for name in CASES if name != "native_hybrid_attention_state"}
CALLER_CASES["gated_delta_rule_zero_state"] = functools.partial(_zero_state, delta_rule_case)


@pytest.mark.parametrize("name", sorted(CALLER_CASES))
def test_rung_traces_inside_a_callers_shard_map(pallas_on_cpu, name):
    """A caller's data-parallel shard_map (`check_vma` on) around the rung: every mesh axis is
    manual, so the kernel runs directly on the device's rows; forward and backward trace with
    the types checked (a state the kernel starts from zeros varies as the rows do), and the
    replicated inputs' gradients (SSD's A, the conv's weight and bias) come back invariant, as
    their out specs `P()` require."""
    run, x, layouts = CALLER_CASES[name]()
    specs = {n: P("data") if layouts[n].startswith("B") else P() for n in x}

    def grads(x, ids):
        return jax.grad(lambda x: sum(jnp.sum(y) for y in jax.tree.leaves(run(x, ids))))(x)

    with jax.set_mesh(make_mesh(MeshConfig(data=2), jax.devices()[:2])):
        jaxpr = jax.make_jaxpr(jax.shard_map(grads, in_specs=(specs, P("data")),
                                             out_specs=specs))(x, IDS).jaxpr
    assert _count(jaxpr, "pallas_call") >= 2


# Context-parallel attention on the kernels: the heads-for-time form (all_to_all, then the
# flash kernel over the whole sequence for a device's heads).
def attention_active_case(api=ops):
    """Oryx's attention-mode rows only: a block of 8 query rows all inactive in each row."""
    run, x, layouts = attention_case(api=api)
    active = jnp.asarray(np.tile([1] * 4 + [0] * 8 + [1, 0, 1, 1], (B, 1)), bool)
    return (lambda x, ids: api.attention(x["q"], x["k"], x["v"], segment_ids=ids,
                                         active_queries=active, implementation="pallas"),
            x, layouts)


CP_CASES = CASES | {"attention_active_queries": attention_active_case}
CONTEXT_PARALLEL = ("attention", "attention_active_queries", "gated_delta_rule",
                    "gated_slot_attention", "native_hybrid_attention", "short_conv", "ssd")
CP_MESH = MeshConfig(data=2, seq=2, tensor=2)


@pytest.mark.parametrize("name", CONTEXT_PARALLEL)
def test_context_parallel_rung_traces_with_check_vma(pallas_on_cpu, name):
    """Inside context parallelism's shard_map (manual over `seq`) the rung maps batch and heads
    over the remaining axes: a shard_map in a shard_map, types checked (`check_vma` on)."""
    run, x, _ = CP_CASES[name](api=cp)
    with jax.set_mesh(make_mesh(CP_MESH)):
        jaxpr = jax.make_jaxpr(_loss_and_grads(run, x, IDS))(x, IDS).jaxpr
    # Forward and backward: context parallelism's own, and the rung's in each of its passes.
    assert _count(jaxpr, "shard_map") >= 4
    assert _count(jaxpr, "pallas_call") >= 2


@pytest.mark.slow
@pytest.mark.parametrize("name", CONTEXT_PARALLEL)
def test_context_parallel_rung_equals_one_device(pallas_on_cpu, vma_off, name):
    """`seq=2 × data=2 × tensor=2`: outputs and gradients equal the single-device op's."""
    run, x, _ = CP_CASES[name](api=cp)
    fn = jax.jit(_loss_and_grads(run, x, IDS))
    expected = fn(x, IDS)
    with jax.set_mesh(make_mesh(CP_MESH)):
        got = fn(x, IDS)
    assert_close(got, expected, 1e-5, f"context-parallel {name} outputs and gradients")


ONE_GROUP = dict(ssd=functools.partial(ssd_case, groups=1),
                 attention=functools.partial(attention_case, kv_heads=1))


@pytest.mark.parametrize("name", sorted(ONE_GROUP))
def test_one_group_stays_whole_while_heads_split(pallas_on_cpu, name, caplog):
    """Mamba-2's single B/C group and MQA's single kv head: heads split over `tensor`, the
    group whole on every device (its gradient summed over them); traced with `check_vma`."""
    run, x, _ = ONE_GROUP[name]()
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.dispatch"), jax.set_mesh(
            make_mesh(MeshConfig(data=2, tensor=2))):
        jaxpr = jax.make_jaxpr(_loss_and_grads(run, x, IDS))(x, IDS).jaxpr
    assert _count(jaxpr, "shard_map") >= 2 and not caplog.records


def test_one_group_an_output_carries_keeps_the_heads_whole(caplog):
    """A single group that an output carries (e.g. NHA's final slots of one kv head) is not
    kept whole beside split heads: each device's share of that output would be claimed
    replicated. The heads then do not split (logged) and the batch still does."""
    q, kv = jnp.ones((4, 3, 4, 2)), jnp.ones((4, 3, 1, 2))
    kernel = lambda q, kv: (q * 2, kv + q.sum(axis=2, keepdims=True))
    call = lambda q, kv: partition.shard_kernel("test", kernel, (q, kv), ("BTHD", "BTGD"),
                                                ("BTHD", "BTGD"))
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.dispatch"), jax.set_mesh(
            make_mesh(MeshConfig(data=2, tensor=2))):
        out, group = jax.jit(call)(q, kv)
    assert_close(group, kv + 4.0, 1e-6, "the group's output from all four heads")
    (message,) = [r.getMessage() for r in caplog.records if r.name == "hybrid_jax.dispatch"]
    assert "heads 4, groups 1 do not split over the 2 devices of mesh axis 'tensor'" in message


@pytest.mark.slow
def test_one_group_on_a_mesh_equals_one_device(pallas_on_cpu, vma_off, monkeypatch):
    monkeypatch.setitem(CASES, "ssd", ONE_GROUP["ssd"])
    _check_rung("ssd", MeshConfig(data=2, tensor=2), grads=True)


@pytest.mark.slow
def test_sharded_kernels_benchmark_rows(pallas_on_cpu, vma_off):
    """`experiments/benchmarks/sharded_kernels` at `--shrink 2` (GQA 8/2 heads): on the 8 fake
    devices every mesh row equals the one-device row within bf16 rounding, and no all-gather
    is compiled. (Not a single group: XLA on CPU aborts on the bf16 all-reduce of its gradient
    that shard_map without `check_vma` adds.) Slow (~30 s: four programs interpreted); the
    default suite has the same shard_maps in `test_rung_on_a_mesh_equals_one_device`."""
    rows = sharded_kernels.run_case("attention", batch=8, length=16, shrink=2, iters=1)
    assert [r["mesh"] for r in rows] == ["1 device", "manual 1", "data=8 tensor=1",
                                         "data=4 tensor=2"]
    assert all(r["rel_err"] < 1e-2 and r["all_gathers"] == 0 for r in rows), rows


def test_heads_that_do_not_split_fall_back_to_batch_shards(pallas_on_cpu, vma_off, caplog):
    """SSD with 2 B/C groups on 4 tensor devices: batch-only shards, logged once per shapes;
    the result still equals one device's."""
    run, x, layouts = ssd_case(heads=4, groups=2)
    fn = jax.jit(lambda x, ids: run(x, ids)[0])
    expected = fn(x, IDS)
    mesh = make_mesh(MeshConfig(data=2, tensor=4))
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.dispatch"), jax.set_mesh(mesh):
        got = fn(x, IDS)
        jax.make_jaxpr(fn)(x, IDS)  # same shapes: no second record
    assert_close(got, expected, 1e-5, "batch-only shards")
    (message,) = [r.getMessage() for r in caplog.records if r.name == "hybrid_jax.dispatch"]
    assert "ssd: the Pallas kernel runs whole" in message, message
    assert "heads 4, groups 2 do not split over the 4 devices of mesh axis 'tensor'" in message


def _doubling_kernel():
    """A kernel that doubles its input, and the list of the shapes it was traced with."""
    seen = []

    def kernel(x):
        seen.append(x.shape)
        return x * 2

    return seen, kernel


def test_trivial_mesh_and_manual_axes_leave_the_call_alone():
    """No mesh, a mesh whose batch and head axes have size 1, and axes an enclosing shard_map
    made manual: the kernel is called directly on what it gets."""
    seen, kernel = _doubling_kernel()
    call = lambda x: partition.shard_kernel("test", kernel, (x,), ("BH",), "BH")
    x = jnp.ones((4, 4))
    call(x)
    with jax.set_mesh(make_mesh(MeshConfig(data=1, seq=2))):
        jax.jit(call)(x)
    with jax.set_mesh(make_mesh(MeshConfig(data=2, tensor=2))):
        jax.jit(jax.shard_map(call, in_specs=P("data", "tensor"), out_specs=P("data", "tensor")))(x)
    assert seen == [(4, 4), (4, 4), (2, 2)]


@pytest.mark.parametrize("layout, x, per_device, warning", [
    # 3 rows on 2 data devices: every device gets all rows and its heads, logged once.
    ("BH", np.arange(12.0).reshape(3, 4), (3, 2),
     "the Pallas kernel runs whole on every device for what does not split: batch [3] is not a "
     "multiple of the 2 devices of mesh axes ('data',)"),
    ("H", np.arange(4.0), (2,), None),  # no batch axis: the heads split, nothing to say
])
def test_what_does_not_split_stays_whole_while_the_heads_split(caplog, layout, x, per_device,
                                                                 warning):
    seen, kernel = _doubling_kernel()
    dispatch._LOGGED.clear()
    call = lambda x: partition.shard_kernel("uneven", kernel, (x,), (layout,), layout)
    with caplog.at_level(logging.WARNING, logger="hybrid_jax.dispatch"), jax.set_mesh(
            make_mesh(MeshConfig(data=2, tensor=2))):
        got = jax.jit(call)(jnp.asarray(x))
    assert seen == [per_device]
    np.testing.assert_array_equal(got, 2 * x)
    if warning is None:
        assert not caplog.records, caplog.text
    else:
        assert f"uneven: {warning}" in caplog.text


def test_layouts_are_checked():
    x = jnp.ones((4, 4))
    with jax.set_mesh(make_mesh(MeshConfig(data=2))):
        with pytest.raises(ValueError, match="layout 'BTH' names 3 dimensions"):
            partition.shard_kernel("test", lambda x: x, (x,), ("BTH",), "BH")
        with pytest.raises(ValueError, match=r"disagree on their batch \(B\): \[2, 4\]"):
            partition.shard_kernel("test", lambda x, y: x, (x, x[:2]), ("BH", "BH"), "BH")


def test_mesh_axes_are_those_of_the_rule_table():
    assert partition.BATCH_AXES == LOGICAL_AXIS_RULES["batch"]
    assert partition.HEAD_AXIS == LOGICAL_AXIS_RULES["heads"] == LOGICAL_AXIS_RULES["kv_heads"]
    assert partition.SEQ_AXIS == LOGICAL_AXIS_RULES["seq"]


@pytest.fixture
def row_kernels_on_cpu(monkeypatch):
    """The norms' and the loss statistics' pallas rungs in interpret mode (tiny tiles)."""
    kernels_in_interpret_mode(monkeypatch, ((rms_norm_api, "rms_norm", test_rms_norm.TINY),
                                            (logit_stats_api, "logit_stats",
                                             test_logit_stats.TINY)))


ROW_CASES = {
    "rms_norm": (lambda x: ops.rms_norm(x[0], x[1], implementation="pallas"),
                 lambda: normals(20, (B, T, 12), (12,), dtype=np.float32)),
    "gated_rms_norm heads": (
        lambda x: ops.gated_rms_norm(x[0], x[2], x[1], norm_before_gate=False,
                                     implementation="pallas"),
        lambda: normals(21, (B, T, 3, 8), (8,), (B, T, 3, 8), dtype=np.float32)),
    "logit_stats": (lambda x: ops.logit_stats(x[0], x[1], implementation="pallas"),
                    lambda: (normals(22, (B, T, 40), dtype=np.float32),
                             jnp.asarray(np.arange(B * T).reshape(B, T) % 40))),
}


def run_without_all_gather(run, inputs, mesh_config: MeshConfig, spec):
    """`run(inputs)` jitted with each input placed by `spec(x)` on the mesh; its compiled
    program holds no all-gather."""
    mesh = make_mesh(mesh_config)
    placed = [jax.device_put(x, NamedSharding(mesh, spec(x))) for x in inputs]
    with jax.set_mesh(mesh):
        fn = jax.jit(run)
        text = fn.lower(placed).compile().as_text()
        got = fn(placed)
    assert "all-gather" not in text
    return got


@pytest.mark.parametrize("name", list(ROW_CASES))
def test_row_kernels_split_the_sequence(row_kernels_on_cpu, vma_off, name):
    """Under context parallelism's `data=2 × seq=4` the row-wise kernels run on each device's
    batch rows and tokens: no all-gather of the sequence, the single-device values."""
    run, make = ROW_CASES[name]
    inputs = make()
    expected = run(inputs)
    got = run_without_all_gather(run, inputs, MeshConfig(data=2, seq=4),
                                 lambda x: P("data", "seq") if x.ndim >= 2 else P())
    assert_close(got, expected, 1e-6, name)


def test_norm_of_heads_splits_the_heads(row_kernels_on_cpu, vma_off):
    """A `[B, T, H, C]` norm (GDN's output norm) runs on each device's heads under `tensor`:
    no all-gather of the heads, the single-device values."""
    run, _ = ROW_CASES["gated_rms_norm heads"]
    inputs = normals(23, (B, T, 4, 8), (8,), (B, T, 4, 8), dtype=np.float32)
    expected = run(inputs)
    got = run_without_all_gather(run, inputs, MeshConfig(data=2, tensor=4),
                                 lambda x: P("data", None, "tensor") if x.ndim == 4 else P())
    assert_close(got, expected, 1e-6)


def test_row_kernels_lower_with_the_sequence_split(monkeypatch, caplog):
    """On a GPU (Pallas' Triton lowering, no GPU needed; `check_vma` on, as the library runs)
    the norm's forward and backward and the loss statistics lower to their kernels inside a
    shard_map manual over `data` and `seq`, each on a [2, 64, ·] shard of [4, 256, ·]."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(target, "platform", lambda: "gpu")  # under the mesh of CPU devices
    dispatch._LOGGED.clear()
    spec = jax.ShapeDtypeStruct

    def step(x, scale, logits, targets):
        norm_grads = jax.grad(lambda x, g: jnp.sum(ops.rms_norm(x, g).astype(jnp.float32)),
                              argnums=(0, 1))(x, scale)
        return norm_grads, ops.logit_stats(logits, targets)

    with jax.set_mesh(make_mesh(MeshConfig(data=2, seq=4))), \
            caplog.at_level(logging.INFO, "hybrid_jax.dispatch"):
        text = jax.jit(step).trace(spec((4, 256, 1024), jnp.bfloat16), spec((1024,), jnp.float32),
                                   spec((4, 256, 512), jnp.float32),
                                   spec((4, 256), jnp.int32)).lower(
            lowering_platforms=("cuda",)).as_text()
    assert not caplog.records, caplog.text
    assert text.count("__gpu$xla.gpu.triton") == 3
    manual = [line for line in text.splitlines() if "sdy.manual_computation" in line]
    assert len(manual) == 3 and all('manual_axes={"data", "seq"}' in line for line in manual)
    assert "tensor<2x64x1024xbf16>" in text and "tensor<2x64x512xf32>" in text


def test_a_sequence_that_does_not_split_stays_whole(row_kernels_on_cpu, vma_off, caplog):
    run, make = ROW_CASES["rms_norm"]
    x, scale = make()
    x = x[:, :6]  # 6 tokens over 4 devices
    expected = run((x, scale))
    with jax.set_mesh(make_mesh(MeshConfig(data=2, seq=4))), \
            caplog.at_level(logging.WARNING, "hybrid_jax.dispatch"):
        assert_close(jax.jit(run)((x, scale)), expected, 1e-6)
    assert "sequence [6] is not a multiple of the 4 devices of mesh axis 'seq'" in caplog.text


def _loop_kernel(x_ref, o_ref):
    o_ref[...] = jax.lax.fori_loop(0, 2, lambda i, acc: acc + x_ref[...],
                                   jnp.zeros_like(x_ref[...]))


def test_interpreter_needs_vma_off():
    """jax's Pallas interpreter fails under shard_map's `check_vma` on a kernel with a loop, the
    reason `vma_off` exists. When this starts failing, jax has fixed it: drop `vma_off`."""
    from pallas_kernels.call import pallas_call

    kernel = lambda x: pallas_call(_loop_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                   interpret=True)(x)
    run = jax.jit(jax.shard_map(kernel, in_specs=P("data"), out_specs=P("data")))
    with jax.set_mesh(make_mesh(MeshConfig(data=2))):
        jax.make_jaxpr(run)(jnp.ones((4, 8)))  # the types check
        with pytest.raises(ValueError, match="mismatched varying manual axes"):
            run(jnp.ones((4, 8)))
