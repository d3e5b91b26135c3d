#!/bin/bash
# Session 20, call c (on call b's warm machine: /tmp/site and fla's Triton cache /tmp/triton_fla
# kept): the NHA kernel against the fla chunk_gsa + flex-attention composition and cuDNN's
# sliding window, fwd+bwd in the same run, B4 T8192 and B1 T32768 (H16 D128 M64 w512).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
ls /tmp/triton_fla | wc -l
timeout 420 python3 -m experiments.benchmarks.nha_kernel --parts table --table-variants "" \
    --fla-cache /tmp/triton_fla --peer-timeout 260 --out $OUT/nha_table.json > $OUT/nha_table.log 2>&1
echo "nha rc=$?"
filt $OUT/nha_table.log | grep -v "^{\|^peer" | tail -16 | cut -c1-190
grep "^peer" $OUT/nha_table.log | cut -c1-400
