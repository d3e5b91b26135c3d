#!/bin/bash
# Session 19, call f (on call e's warm machine, its /tmp/site kept): the NHA check's API row
# with the slot feature tiles split at 4 and at 8 backward warps (s19e: the 8-warp one wrong;
# that variant is since removed from nha_kernel.VARIANTS: the GPU path refuses it).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 150 python3 -m experiments.benchmarks.nha_kernel --parts check --no-peer \
    --check-variants slot_features_tiled_split_w4,slot_features_tiled_split_w8 \
    --out $OUT/nha_check2.json > $OUT/nha_check2.log 2>&1
echo "rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/nha_check2.log | cut -c1-200 | tail -12
