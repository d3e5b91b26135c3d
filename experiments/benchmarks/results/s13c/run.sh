#!/bin/bash
# Session 13, call c (issue 15): the GPU checks of the session's defaults (SSD's training
# forward through the state pass; GDN's forward state pass reading the decays after W S, and
# Round 15's folded reverse update, checked in call b); GDN's output kernel over key blocks
# (cp.async-pipelined) at both shapes; SSD's table at the new defaults; fla in the same runs.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out $OUT/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-190 | tail -12
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out $OUT/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 130 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'outputs V64 K64 3 stages;outputs V128 K64 3 stages;outputs V64 K64 2 stages' \
    --shapes gdn-340m@4x8192,4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 \
    --time-limit 120 --out $OUT/gdn.json > $OUT/gdn.log 2>&1
echo "gdn rc=$?"; filt $OUT/gdn.log | grep "^gated\|^op " | cut -c1-150
timeout 80 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --variants none --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 \
    --time-limit 70 --out $OUT/ssd.json > $OUT/ssd.log 2>&1
echo "ssd rc=$?"; filt $OUT/ssd.log | grep "^ssd\|^op " | cut -c1-150
