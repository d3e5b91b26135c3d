#!/bin/bash
# Session 49, after s49c/run.sh (whose pytest -n 8 lost its workers at start on this machine):
# the same CPU tests under the device's JAX, in one process (-n 0). Carry .whl. It found the
# suite's conftest aborting under JAX 0.11.2 (an XLA flag that version dropped); run again
# after that fix (288ca18): 34 passed (out-h100/cpu_tests_serial.log).
export OUT=$OUT/s49c; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pytest --version 2>&1 | tail -1
JAX_PLATFORMS=cpu timeout 400 python3 -m pytest -q -p no:cacheprovider -n 0 -x \
    tests/ops/test_explicit_axes_ops.py tests/test_explicit_axes.py \
    tests/benchmarks/test_kernel_traffic.py 2>&1 | grep -v "Warning\|warner" | tee $OUT/cpu_tests_serial.log | tail -30 | cut -c1-220
