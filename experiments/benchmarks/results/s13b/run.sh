#!/bin/bash
# Session 13, call b (issues 15, 14): SSD round 5's state pass variants against the fused
# default with fla's forward in the same run; GDN after Round 14: K 128 key blocks, per-kernel
# times of ours (op_kernels) and fla's (torch profiler); gdn-340m vs transformer-350m on packed
# WikiText-2 at T 8192 (after Rounds 11-14).
# From the repo root, carrying .whl, .gpu and .devdata/wikitext2_bpe32k.npz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 130 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --variants 'state pass;state pass 1 stage;state pass 8 warps;state pass whole N' \
    --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 120 \
    --out $OUT/ssd.json > $OUT/ssd.log 2>&1
echo "ssd rc=$?"; filt $OUT/ssd.log | grep "^ssd\|^op " | cut -c1-150
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'forward key blocks' --shapes 4x8192 \
    --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 90 --out $OUT/k128.json \
    > $OUT/k128.log 2>&1
echo "k128 rc=$?"; filt $OUT/k128.log | grep "^gated\|^op " | cut -c1-150
TRITON_CACHE_DIR=/tmp/triton_fla TRITON_CACHE_AUTOTUNING=1 timeout 60 python3 -m experiments.benchmarks.peers.fla_linear \
    --profile --ops gated_delta_rule --shapes gdn-340m@4x8192 > $OUT/fla_profile.jsonl 2> $OUT/fla_profile.err
echo "fla rc=$?"; cut -c1-900 $OUT/fla_profile.jsonl; tail -3 $OUT/fla_profile.err
timeout 60 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --out $OUT/kernels_k256.json > $OUT/kernels_k256.log 2>&1
echo "kernels rc=$?"; filt $OUT/kernels_k256.log | grep -v "^{" | grep "ms of\|chunk_" 
timeout 200 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 190 --out $OUT/train_wikitext_8192.json \
    > $OUT/train_wikitext_8192.log 2>&1
echo "train rc=$?"; filt $OUT/train_wikitext_8192.log | tail -3
