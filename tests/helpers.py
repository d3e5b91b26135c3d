"""Shared assertions for tests (relative errors of values and gradients) and helpers."""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from unittest import mock

import jax
import numpy as np
import pytest
from flax import nnx

import hybrid_jax as hj


def kernels_in_interpret_mode(monkeypatch, kernels, gpu_ops=()) -> None:
    """The ops' pallas rungs on the CPU: the ops modules `gpu_ops` (names under
    `hybrid_jax.ops`) see a GPU, and each `(api module, entry, tiles)` of `kernels` runs its
    kernel in interpret mode with the tiles `tiles`; the once-per-reason fallback log starts
    empty."""
    from hybrid_jax.ops import dispatch

    for name in gpu_ops:
        monkeypatch.setattr(importlib.import_module(f"hybrid_jax.ops.{name}"), "backend",
                            lambda: "gpu")
    for module, entry, tiles in kernels:
        monkeypatch.setattr(module, entry, functools.partial(
            getattr(module, entry), interpret=True, block_sizes=tiles))
        monkeypatch.setattr(module, "unsupported",
                            functools.partial(module.unsupported, interpret=True))
    dispatch._LOGGED.clear()


def rel_err(actual, expected) -> float:
    """‖actual − expected‖ / ‖expected‖ over all elements (float64 / complex128 numpy)."""
    dtype = np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64
    a = np.asarray(actual, dtype=dtype)
    e = np.asarray(expected, dtype=dtype)
    if a.shape != e.shape:
        raise AssertionError(f"shape mismatch: {a.shape} vs {e.shape}")
    if not np.all(np.isfinite(a)):
        raise AssertionError("non-finite values in result")
    denom = np.linalg.norm(e)
    return float(np.linalg.norm(a - e) / (denom if denom > 0 else 1.0))


def assert_close(actual, expected, tol: float, what: str = "") -> None:
    """Asserts every leaf of two pytrees agrees to relative error `tol`."""
    leaves_a, tree_a = jax.tree.flatten(actual)
    leaves_e, tree_e = jax.tree.flatten(expected)
    assert tree_a == tree_e, f"{what}: tree mismatch {tree_a} vs {tree_e}"
    for i, (a, e) in enumerate(zip(leaves_a, leaves_e, strict=True)):
        err = rel_err(a, e)
        assert err < tol, f"{what} leaf {i}: relative error {err:.3e} >= {tol:.1e}"


def normals(seed: int, *shapes, dtype=np.float64):
    """Standard-normal test inputs from numpy (no per-shape XLA compile, unlike jax.random)."""
    rng = np.random.default_rng(seed)
    arrays = [jax.numpy.asarray(rng.standard_normal(shape), dtype=dtype) for shape in shapes]
    return arrays[0] if len(arrays) == 1 else arrays


def assert_directional_derivatives(grads: dict, numpy_loss, point, seed: int,
                                   eps: float = 1e-6, tol: float = 1e-6) -> None:
    """Autodiff gradients of one loss at `point` (a tuple of arrays or pytrees; `grads` maps a
    name, e.g. the rung, to a pytree like `point`) against central differences of its float64
    numpy definition `numpy_loss(*point)`, along one random direction per leaf, each leaf
    moved alone (so errors in two inputs cannot cancel)."""
    leaves, tree = jax.tree.flatten(point)
    rng = np.random.default_rng(seed)
    for i, leaf in enumerate(leaves):
        direction = rng.standard_normal(np.shape(leaf))

        def moved(sign: float, i=i, direction=direction):
            return tree.unflatten([np.asarray(x) + (sign * eps * direction if j == i else 0)
                                   for j, x in enumerate(leaves)])

        numeric = (numpy_loss(*moved(1.0)) - numpy_loss(*moved(-1.0))) / (2 * eps)
        for name, grad in grads.items():
            analytic = float(np.sum(np.asarray(jax.tree.leaves(grad)[i]) * direction))
            assert abs(analytic - numeric) < tol * max(1.0, abs(numeric)), \
                f"{name}, input {i}: autodiff {analytic:.9g}, numeric {numeric:.9g}"


def assert_init_stds(module, stds: dict[str, float], rtol: float) -> None:
    """Each named projection of `module` has `init_std` `stds[name]` and a kernel drawn at it
    (its sample std within `rtol`: a few percent for thousands of draws)."""
    for name, std in stds.items():
        proj = getattr(module, name)
        assert proj.init_std == pytest.approx(std), name
        drawn = np.asarray(proj.kernel[...]).std()
        assert abs(drawn / std - 1) < rtol, (name, drawn, std)


def assert_refused(op, arrays: dict, change: dict, message: str) -> None:
    """`op(**arrays)` with `change` applied raises a ValueError matching `message`: each entry
    of `change` is a function of the named array (a bad input) or a keyword's value."""
    arrays, kwargs = dict(arrays), {}
    for name, value in change.items():
        if callable(value):
            arrays[name] = value(arrays[name])
        else:
            kwargs[name] = value
    with pytest.raises(ValueError, match=message):
        op(**arrays, **kwargs)


class _Parsed(Exception):
    """Raised by `parsed_by_main` once a module's own parser has read its arguments."""


def parsed_by_main(module: str, argv: list[str]):
    """The `argparse.Namespace` that `module.main` (given `argv`, or with them as `sys.argv`
    when it takes none) parses, stopped right after its parser succeeded: a documented
    command's flags checked without running it. A bad flag raises SystemExit."""
    parse, seen = argparse.ArgumentParser.parse_args, {}

    def parse_then_stop(parser, args=None, namespace=None):
        seen["args"] = parse(parser, args, namespace)
        raise _Parsed

    main = importlib.import_module(module).main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            mock.patch.object(sys, "argv", [module, *argv]):
        try:
            main(argv) if main.__code__.co_argcount else main()
        except _Parsed:
            return seen["args"]
    raise AssertionError(f"{module}.main returned without parsing its arguments")


def tpu_mesh(device_kind: str = "TPU v5 lite") -> jax.sharding.AbstractMesh:
    """An abstract mesh without axes whose device is a TPU of `device_kind`: traced under it,
    the library picks its TPU kernels (`pallas_kernels.target.platform`) and Pallas's
    TPU lowering reads the chip's parameters from it."""
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=1, platform="tpu")
    return jax.sharding.AbstractMesh((), (), abstract_device=device)


def lower_for_tpu(fn, *args, device_kind: str = "TPU v5 lite") -> str:
    """The StableHLO text of `jax.jit(fn)(*args)` lowered for TPU, on any host.

    Pallas's TPU lowering (block-shape rules, the kernel body to Mosaic) runs here, so a kernel
    that could not compile on a TPU fails on the CPU. `args` may be ShapeDtypeStructs: nothing
    runs. The call is traced under `tpu_mesh(device_kind)`. The Mosaic compiler's own passes
    (layouts, VMEM) run only in libtpu's compiler: `compile_for_tpu`."""
    with jax.sharding.use_abstract_mesh(tpu_mesh(device_kind)):
        exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
    return exported.mlir_module()


def compile_for_tpu(fn, *args, topology: str = "v5e:2x2"):
    """`jax.jit(fn)` compiled by libtpu's compiler for one chip of a TPU `topology` (as
    `jax.experimental.topologies` names them: "v4:2x2x1", "v5e:2x2", "v5p:2x2x1",
    "v6e:2x2"), on any host where libtpu is installed: beyond `lower_for_tpu`, Mosaic's own
    passes (layout inference, VMEM limits) run. `args`: pytrees of ShapeDtypeStructs."""
    from jax.experimental import topologies

    device = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                          args)
    with jax.sharding.use_abstract_mesh(tpu_mesh(device.device_kind)):
        lowered = jax.jit(fn).lower(*placed)
    return lowered.compile()


def assert_packed_documents_isolated(model, lengths=(5, 7), tol: float = 1e-5) -> None:
    """The logits of documents packed in one row (segment ids, positions restarting at each)
    equal those of each document alone: no state, window, conv or cache leaks across."""
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, model.config.vocab_size, (1, n)) for n in lengths]
    packed = jax.numpy.asarray(np.concatenate(documents, axis=1), jax.numpy.int32)
    segment_ids = jax.numpy.asarray([np.repeat(np.arange(len(lengths)), lengths)])
    positions = jax.numpy.asarray([np.concatenate([np.arange(n) for n in lengths])])
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t, **kw: nnx.merge(graphdef, s)(t, **kw))
    out = forward(state, packed, positions_BT=positions, segment_ids_BT=segment_ids)
    starts = np.cumsum((0, *lengths))
    for i, document in enumerate(documents):
        alone = forward(state, jax.numpy.asarray(document, jax.numpy.int32))
        assert_close(out[:, starts[i]:starts[i + 1]], alone, tol, f"document {i}")


@functools.cache
def _model_parts(config, seed: int):
    return nnx.split(hj.create_model(config, seed=seed))


def shared_model(config, seed: int = 0):
    """`hj.create_model(config, seed=seed)` as a fresh module per call, initialised (compiled)
    once per (config, seed) in this process: tests that change a module's values do not leak."""
    return nnx.merge(*_model_parts(config, seed))


def stub_train(monkeypatch, module, losses, *, nonfinite_at=None, eval_loss=3.25, every=10):
    """Replaces `module.train` (an experiment's trainer) by one that writes `losses`, a record
    every `every` steps, to the run's metrics.jsonl, then raises NonFiniteLossError at step
    `nonfinite_at` or returns `eval_loss`. Like the trainer, it first writes `config.json`."""
    import json

    from hybrid_jax.config import to_dict
    from hybrid_jax.train.trainer import NonFiniteLossError

    def train(config, run_dir, **kwargs):
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config)))
        (run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"step": every * i, "loss": loss}) + "\n" for i, loss in enumerate(losses)))
        if nonfinite_at is not None:
            raise NonFiniteLossError("loss is nan", nonfinite_at)
        return {"eval_loss": eval_loss}

    monkeypatch.setattr(module, "train", train)


class FakeClock:
    """A `time` module stand-in whose `perf_counter` moves only when a test sets `now`."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now
