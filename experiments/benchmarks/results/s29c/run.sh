#!/bin/bash
# Session 29, call c (not run; for the next session, after s29b and only if a chunk-128 variant
# won there; carry .whl): the GPU check (bf16 against the float32 reference, documents,
# states, strong gates) with chunks of 128 and the slot kernels at 8 warps, before any default
# changes. The shipped defaults' rows (session 28): out ≤ 0.0019, strong-gate dg 0.0295.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT
timeout 500 python3 -m experiments.benchmarks.nha_kernel --check --check-variants "" \
    --check-changes chunk=128,slot_num_warps=8,slot_backward_num_warps=8 \
    --out $OUT/check.json > $OUT/check.log 2>&1
echo "check rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/check.log | tail -24 | cut -c1-200
