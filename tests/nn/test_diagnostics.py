"""diagnostics: what `recorded` returns (latest report wins, dotted module paths), that
nothing is sown outside it, and how `scalars` names each element."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.nn import diagnostics


class Child(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones(()))

    def __call__(self, x):
        diagnostics.report(self, "total", jnp.sum(x))
        return x * self.w[...]


class Parent(nnx.Module):
    def __init__(self):
        self.child = Child()

    def __call__(self, x):
        diagnostics.report(self, "step", 1.0)
        diagnostics.report(self, "step", 2.0)  # the latest call wins
        return self.child(x) + 1


def test_recorded_returns_the_latest_report_by_module_path_and_stores_nothing():
    model, x = Parent(), jnp.arange(3.0)
    before = jax.tree.structure(nnx.state(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flax deprecates a sow outside nnx.capture
        out, reported = diagnostics.recorded(lambda m: m(x), model)
        assert reported.keys() == {"step", "child.total"}
        assert float(reported["step"]) == 2.0 and float(reported["child.total"]) == 3.0
        np.testing.assert_array_equal(out, x + 1)
        np.testing.assert_array_equal(model(x), x + 1)  # after recorded: reports do nothing
    assert jax.tree.structure(nnx.state(model)) == before


def test_scalars_names_one_scalar_per_element_in_row_major_order():
    values = {"a": jnp.asarray(1.5), "b": jnp.asarray([2.0]),
              "c": jnp.asarray([[1.0, 2.0], [3.0, 4.0]])}
    got = {k: float(v) for k, v in diagnostics.scalars(values).items()}
    assert got == {"diag/a": 1.5, "diag/b/0": 2.0, "diag/c/0": 1.0, "diag/c/1": 2.0,
                   "diag/c/2": 3.0, "diag/c/3": 4.0}
    assert all(np.ndim(v) == 0 for v in diagnostics.scalars(values).values())
