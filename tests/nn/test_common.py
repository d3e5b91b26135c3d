"""nn.common: `unless` skips its branch (zeros of its shape and dtype, under jit too) and
`shared_or_new` builds only what is not shared."""

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.nn.common import shared_or_new, unless


def test_unless_gives_zeros_when_skipped_and_the_branch_otherwise():
    x = jnp.arange(6.0).reshape(2, 3)
    fn = lambda x, y: (x * y + 1).astype(jnp.bfloat16)  # noqa: E731
    run = jax.jit(lambda skip: unless(skip, fn, x, 2.0))
    skipped, taken = run(jnp.bool_(True)), run(jnp.bool_(False))
    assert skipped.dtype == taken.dtype == jnp.bfloat16 and skipped.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(skipped, np.float32), np.zeros((2, 3)))
    np.testing.assert_array_equal(np.asarray(taken, np.float32), 2 * np.asarray(x) + 1)
    assert "cond" in str(jax.make_jaxpr(lambda s: unless(s, fn, x, 2.0))(True))  # not both


def test_shared_or_new_builds_only_what_is_not_shared():
    built = []
    build = lambda: built.append(1) or "new"  # noqa: E731
    assert shared_or_new({"k": "shared"}, "k", build) == "shared" and not built
    assert shared_or_new({"k": "shared"}, "v", build) == "new"
    assert shared_or_new(None, "k", build) == "new" and len(built) == 2
