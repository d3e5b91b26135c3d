#!/bin/bash
# Session 21, call c (warm): the SSD GPU check on the previous tree (no D), its inputs drawn as
# call b's (the same keys, D's draw skipped, bf16-representable cotangents): is b's dA 0.023 at
# P 64 N 256 the draw or the skip?
# (.gpu/base = `git archive` of 3bc75d4, its ssd_kernel.py edited for this call only: keys split 10,
# one normal(heads) drawn after the initial state, y's cotangent weights rounded to bf16.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
cd .gpu/base && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m experiments.benchmarks.linear_ops \
    --parts check --ops ssd --no-fla --out $OUT/ssd_check_base.json > $OUT/ssd_check_base.log 2>&1
echo "base check rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/ssd_check_base.log | tail -8 | cut -c1-240
