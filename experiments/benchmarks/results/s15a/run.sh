#!/bin/bash
# Session 15, call a: session 14's default-off options timed against the defaults in one run:
# short-conv streaming backward (check + variants), the Pallas RMSNorm (check + table), GDN
# 'prepare TF32 merges' / 'states by chunk' (table + the TF32 accuracy check), SSD's
# 'vectors in step' (table). From the repo root, carrying .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j
trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 170 python3 -m experiments.benchmarks.short_conv --parts check,variants --channels 768,1536 \
    --variants default,stream,stream_u2,stream_c128,stream_s8,stream_s32 --budget-s 140 \
    --out /tmp/j/short_conv.json > $OUT/short_conv.log 2>&1
echo "short_conv rc=$?"; filt $OUT/short_conv.log | grep -v "^{" | cut -c1-160 | tail -30
timeout 80 python3 -m experiments.benchmarks.rms_norm --parts check,table --budget-s 60 \
    --out /tmp/j/rms_norm.json > $OUT/rms_norm.log 2>&1
echo "rms_norm rc=$?"; filt $OUT/rms_norm.log | grep -v "^{" | cut -c1-160 | tail -20
timeout 120 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --no-fla --shapes 4x8192,gdn-340m@4x8192 --time-limit 115 \
    --variants 'prepare TF32 merges;states by chunk;states by chunk, key blocks;forward key blocks outputs K64' \
    --out /tmp/j/gdn_table.json > $OUT/gdn.log 2>&1
echo "gdn table rc=$?"; filt $OUT/gdn.log | grep "^gated\|^op \|^attention" | cut -c1-130
timeout 75 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
    --variant 'prepare TF32 merges' --out /tmp/j/gdn_tf32_check.json >> $OUT/gdn.log 2>&1
echo "gdn tf32 check rc=$?"; filt $OUT/gdn.log | grep "PASS\|FAIL\|worst\|max" | cut -c1-190 | tail -6
timeout 90 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --no-fla --shapes 4x8192 --time-limit 85 \
    --variants 'state pass, both 3 stages;state pass, states 4 stages, outputs 3;state pass, vectors in step;state pass, vectors in step, states 4 stages' \
    --out /tmp/j/ssd_table.json > $OUT/ssd.log 2>&1
echo "ssd table rc=$?"; filt $OUT/ssd.log | grep "^ssd\|^op " | cut -c1-130
