#!/bin/bash
# Session 19, call b (on call a's warm machine, its /tmp/site kept): the GPU checks of the two
# options call a timed as faster, each applied to every check's defaults: NHA's slot kernels
# over feature tiles of 64 at 4 warps (the API check at D 128 and the op checks with documents
# and a state at D 128 and D 256), SSD chunk_grads' summed score gradients at 2 stages.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 150 python3 -m experiments.benchmarks.nha_kernel --parts check --no-peer \
    --check-variants slot_features_tiled_w4 --check-changes slot_feature_block=64,slot_num_warps=4 \
    --out $OUT/nha_check.json > $OUT/nha_check.log 2>&1
echo "nha check rc=$?"; filt $OUT/nha_check.log | grep -v "^{" | cut -c1-220 | tail -30
timeout 120 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --check-changes grads_summed_scores=True,grads_num_stages=2 \
    --out $OUT/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-200 | tail -9
