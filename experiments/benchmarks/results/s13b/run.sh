#!/bin/bash
# Session 13, call b (issues 15, 14): SSD round 5's state pass variants against the fused
# default with fla's forward in the same run; GDN Round 15 (the reverse pass's update folded,
# no spills) on the GPU check and timed at both shapes with the key-block labels (K 128
# forward, K 256 reverse), per-kernel times; gdn-340m vs transformer-350m on packed
# WikiText-2 at T 8192 (after Rounds 11-15).
# From the repo root, carrying .whl, .gpu and .devdata/wikitext2_bpe32k.npz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out $OUT/check.json > $OUT/check.log 2>&1
echo "check rc=$?"; filt $OUT/check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 110 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --variants 'state pass;state pass 1 stage;state pass 8 warps;state pass whole N' \
    --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 100 \
    --out $OUT/ssd.json > $OUT/ssd.log 2>&1
echo "ssd rc=$?"; filt $OUT/ssd.log | grep "^ssd\|^op " | cut -c1-150
timeout 130 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'forward key blocks;reverse key blocks 128' \
    --shapes gdn-340m@4x8192,4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 \
    --time-limit 120 --out $OUT/gdn.json > $OUT/gdn.log 2>&1
echo "gdn rc=$?"; filt $OUT/gdn.log | grep "^gated\|^op " | cut -c1-150
timeout 60 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --out $OUT/kernels_k256.json > $OUT/kernels_k256.log 2>&1
echo "kernels rc=$?"; filt $OUT/kernels_k256.log | grep -v "^{" | grep "ms of\|chunk_"
timeout 190 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 180 --out $OUT/train_wikitext_8192.json \
    > $OUT/train_wikitext_8192.log 2>&1
echo "train rc=$?"; filt $OUT/train_wikitext_8192.log | tail -3
