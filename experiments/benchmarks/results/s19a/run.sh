#!/bin/bash
# Session 19, call a: GPU checks and op-level timings of session 18's default-off options,
# each against today's default in the same run: NHA's slot kernels over feature tiles
# (slot_feature_block=64) at nha-340m's D 256; GDN's reverse deferred update at gdn-340m's
# K 256; SSD's summed score gradients at P 128 (issue 15's table shape); the RMSNorm
# backward at 4 warps with prefetch.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 120 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape nha-340m@4x8192 --window 32 --documents 1500 --top 14 \
    --variants 'slot features tiled;slot features tiled w4' \
    --out /tmp/j/op_kernels_nha.json > $OUT/op_kernels_nha.log 2>&1
echo "nha op_kernels rc=$?"; filt $OUT/op_kernels_nha.log | grep "ms of kernels\|Error" | cut -c1-140
timeout 90 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --documents 1500 --variants 'reverse deferred update' --top 8 \
    --out /tmp/j/op_kernels_gdn.json > $OUT/op_kernels_gdn.log 2>&1
echo "gdn op_kernels rc=$?"; filt $OUT/op_kernels_gdn.log | grep "ms of kernels\|state_gradients\|Error" | cut -c1-140
timeout 80 python3 -m experiments.benchmarks.op_kernels --ops ssd --shape 4x8192 \
    --variants 'default, grads summed scores;default, grads summed scores 2 stages' --top 6 \
    --out /tmp/j/op_kernels_ssd.json > $OUT/op_kernels_ssd.log 2>&1
echo "ssd op_kernels rc=$?"; filt $OUT/op_kernels_ssd.log | grep "ms of kernels\|chunk_grads\|Error" | cut -c1-140
timeout 90 python3 -m experiments.benchmarks.rms_norm --parts table --budget-s 80 \
    --variants 'backward prefetch;backward 4 warps, prefetch' \
    --out /tmp/j/rms_norm.json > $OUT/rms_norm.log 2>&1
echo "rms_norm rc=$?"; filt $OUT/rms_norm.log | grep -v "^{" | cut -c1-200 | tail -16
timeout 110 python3 -m experiments.benchmarks.delta_rule_kernel --check \
    --variant 'reverse deferred update' --budget-s 100 --out /tmp/j/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-200 | tail -9
