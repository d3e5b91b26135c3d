#!/bin/bash
# Session 15, call b: the new defaults (short-conv streaming backward at 128 channels / 1 warp,
# the Pallas norms automatic on GPUs, SSD's state kernel with its vectors in step at 4 stages;
# GDN's states_by_chunk removed): SSD's GPU check; gdn-340m against transformer-350m on packed
# WikiText-2 at T 8192; the GDN and SSD tables against fla (GDN 'prepare TF32 merges' timed
# again); gdn-340m's step profile. From the repo root, carrying .whl, .gpu and
# .devdata/wikitext2_bpe32k.npz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla /tmp/j && tar xzf .gpu/triton_fla.tgz -C /tmp
trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out /tmp/j/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-190 | tail -12
timeout 200 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --time-limit 190 --out /tmp/j/train_wikitext_8192.json > $OUT/train.log 2>&1
echo "train rc=$?"; filt $OUT/train.log | tail -4 | cut -c1-250
timeout 150 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule,ssd \
    --impls pallas --shapes gdn-340m@4x8192,4x8192 --fla-cache /tmp/triton_fla --fla-timeout 60 \
    --fla-runs 2 --time-limit 140 --variants 'prepare TF32 merges' \
    --out /tmp/j/table.json > $OUT/table.log 2>&1
echo "table rc=$?"; filt $OUT/table.log | grep "^gated\|^ssd\|^attention\|^op \|^target" | cut -c1-130
timeout 110 python3 -m experiments.benchmarks.profile_step --model gdn-340m --length 8192 \
    --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
    --top 30 --out /tmp/j/profile_gdn.json > $OUT/profile_gdn.log 2>&1
echo "profile rc=$?"; filt $OUT/profile_gdn.log | grep -A12 "^category" | head -14
