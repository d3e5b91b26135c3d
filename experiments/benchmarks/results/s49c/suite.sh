#!/bin/bash
# Session 49: the fast test suite under the device's JAX 0.11.2 on its CPU (16 cores, 14
# workers), the notebooks left out (no Jupyter kernel there); interrupted at 320 s if not done
# (SIGINT: pytest prints what ran). Carry .whl.
export OUT=$OUT/s49c; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
JAX_PLATFORMS=cpu timeout -s INT 320 python3 -m pytest -q -n 14 -p no:cacheprovider -rf \
    --ignore=tests/test_notebooks.py tests 2>&1 | grep -v "Warning\|warner" > $OUT/suite_jax011.log
echo "rc=${PIPESTATUS[0]}"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/suite_jax011.log | cut -c1-230 | tail -40
