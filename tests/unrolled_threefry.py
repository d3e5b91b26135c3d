"""Cheaper compiles for the tests: jax's unrolled Threefry lowering on the CPU as well.

On the CPU jax lowers the Threefry-2x32 hash behind every random draw as a `while` loop over
its 5 groups of rounds (elsewhere: unrolled). Both lowerings compute the same 32-bit integer
hash, so every random bit is unchanged (tests/test_unrolled_threefry.py checks the Random123
known answers), but XLA compiles a model's initialisation (one draw per parameter, so one loop
per parameter) about a third faster unrolled, and model initialisation is the largest single
compile of many tests. It uses jax internals: if they move, this warns and the check fails.
"""

import warnings


def use_unrolled_threefry() -> None:
    """Registers the unrolled Threefry lowering for the CPU (call once jax is imported)."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32
        rule = threefry2x32._threefry2x32_lowering_rule  # the unrolled one
        primitive = threefry2x32.threefry2x32_p
    except (ImportError, AttributeError) as e:
        warnings.warn(f"jax's Threefry internals moved ({e}): tests compile the rolled "
                      "lowering, slower", stacklevel=2)
        return
    mlir.register_lowering(primitive, rule, platform="cpu")
