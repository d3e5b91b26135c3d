#!/bin/bash
# Session 20, call b (cold; issue 15's scoreboard, not re-measured against fla since session 15):
# GSA, SSD and GDN against fla in the same run (fla's autotuning compiled first by 12 parallel
# warm-up workers; fastest of two fla processes), at B4 T8192 H16 K = V = 128 and gdn-340m's layer.
# Call c runs on this machine while warm and reuses /tmp/triton_fla.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 500 python3 -m experiments.benchmarks.linear_ops --parts table \
    --ops gated_slot_attention,ssd,gated_delta_rule --impls pallas --variants none \
    --shapes 4x8192,gdn-340m@4x8192 --fla-cache /tmp/triton_fla --fla-warm 12 --fla-runs 2 \
    --fla-timeout 400 --time-limit 490 --out $OUT/linear_fla.json > $OUT/linear_fla.log 2>&1
echo "linear rc=$?"
filt $OUT/linear_fla.log | grep -v "^{\|^fla peer" | tail -20 | cut -c1-190
