"""The tests' unrolled Threefry lowering on the CPU (tests/unrolled_threefry.py, set up by
conftest.py) is in use and gives the Random123 known-answer values of Threefry-2x32-20."""

import jax
import numpy as np
import pytest
from jax._src.random.threefry2x32 import threefry_2x32

# (key, counter) → output: Random123's known answers for threefry2x32_20 (as in jax's own tests).
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def test_the_cpu_lowering_is_unrolled():
    text = jax.jit(threefry_2x32).lower(np.zeros(2, np.uint32), np.zeros(8, np.uint32)).as_text()
    assert "xor" in text and "while" not in text, "conftest's use_unrolled_threefry is not active"


@pytest.mark.parametrize("key, counter, expected", KNOWN_ANSWERS)
def test_known_answers(key, counter, expected):
    out = jax.jit(threefry_2x32)(np.asarray(key, np.uint32), np.asarray(counter, np.uint32))
    assert [int(x) for x in out] == list(expected)
