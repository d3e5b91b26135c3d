#!/bin/bash
# Session 13, call d (issue 15): GDN's new K 256 default (output kernel over key blocks of 64,
# V tiles of 128, 3 stages) on the GPU check and timed at gdn-340m's shape, fla beside it.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out $OUT/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 80 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants none --shapes gdn-340m@4x8192 --fla-cache /tmp/triton_fla \
    --fla-timeout 30 --time-limit 70 --out $OUT/gdn.json > $OUT/gdn.log 2>&1
echo "gdn rc=$?"; filt $OUT/gdn.log | grep "^gated\|^op \|^target" | cut -c1-150
