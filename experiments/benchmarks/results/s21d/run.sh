#!/bin/bash
# Session 21, call d (warm): the SSD GPU check with D on the checks' usual draw (D from a key of
# its own; y's cotangent bf16-representable).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 150 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out $OUT/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/ssd_check.log | tail -8 | cut -c1-240
