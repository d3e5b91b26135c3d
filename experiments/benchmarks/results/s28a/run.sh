#!/bin/bash
# Session 28, call a (run on the warm machine after s27a, s27e and s27d; carry .whl): the GPU
# checks of session 27's base-2 SSD and delta-rule kernels (bf16 against the float32
# reference, documents and states included) — s27c's last two commands, without its op_kernels
# rows (no device time left for them).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out $OUT/check_ssd.json > $OUT/check_ssd.log 2>&1
echo "check ssd rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/check_ssd.log | tail -8 | cut -c1-200
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 50 \
    --out $OUT/check_gdn.json > $OUT/check_gdn.log 2>&1
echo "check gdn rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/check_gdn.log | tail -8 | cut -c1-200
