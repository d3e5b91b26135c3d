#!/bin/bash
# Session 12, call e (issues 15, 14): the defaults after calls a-d (K 256's reverse pass in
# V tiles of 64): the GPU accuracy check; at K 128 the reverse pass in V tiles of 64 too
# ('split outputs V64' = value_block 64 from the new base); both shapes against fla's
# forward; then gdn-340m against transformer-350m on packed WikiText-2 at T 8192 again.
# From the repo root, carrying .whl, .gpu and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 120 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 100 \
    --out $OUT/check.json > $OUT/check.log 2>&1
echo "check rc=$?"; filt $OUT/check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 150 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'split outputs V64' --shapes 4x8192,gdn-340m@4x8192 \
    --fla-cache /tmp/triton_fla --fla-timeout 40 --time-limit 140 --out $OUT/gdn.json \
    > $OUT/gdn.log 2>&1
echo "gdn rc=$?"; filt $OUT/gdn.log | grep "^gated\|^op \|^target" | cut -c1-150
timeout 200 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 190 --out $OUT/train_wikitext_8192.json \
    > $OUT/train_wikitext_8192.log 2>&1
echo "train rc=$?"; filt $OUT/train_wikitext_8192.log | tail -3
