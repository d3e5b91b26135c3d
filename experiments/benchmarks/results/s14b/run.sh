#!/bin/bash
# Session 14, call b: GPU checks of the defaults set from call a (GDN: K 128 output kernel over
# key blocks, K > 128 pipelined key gradients; SSD: the state pass at 3 stages for every use);
# the GDN and SSD tables with fla run twice (its fastest kept); gdn-340m against
# transformer-350m on packed WikiText-2 at T 8192 (issue 14) after Rounds 16-17.
# From the repo root, carrying .whl, .gpu and .devdata/wikitext2_bpe32k.npz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla /tmp/j && tar xzf .gpu/triton_fla.tgz -C /tmp
trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out /tmp/j/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out /tmp/j/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-190 | tail -12
timeout 200 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 190 --out /tmp/j/train_wikitext_8192.json \
    > $OUT/train.log 2>&1
echo "train rc=$?"; filt $OUT/train.log | tail -4 | cut -c1-250
timeout 110 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --shapes gdn-340m@4x8192,4x8192 --fla-cache /tmp/triton_fla --fla-timeout 40 \
    --fla-runs 2 --time-limit 100 \
    --variants 'key gradients pipelined 3 stages;key gradients pipelined 2 stages' \
    --out /tmp/j/gdn.json > $OUT/gdn.log 2>&1
echo "gdn rc=$?"; filt $OUT/gdn.log | grep "^gated\|^attention\|^op \|^target" | cut -c1-120
timeout 70 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 25 --fla-runs 2 --time-limit 65 \
    --variants 'fused kernel;state pass' --out /tmp/j/ssd.json > $OUT/ssd.log 2>&1
echo "ssd rc=$?"; filt $OUT/ssd.log | grep "^ssd\|^attention\|^op \|^target" | cut -c1-120
