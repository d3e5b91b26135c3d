#!/bin/bash
# Session 30, call d (carry .whl, .devdata): the 340M rows at T 8192 after s30b's D 64
# flash-attention defaults, which speed up transformer-350m's attention (D 64) and none of
# gdn-340m / nha-340m (no D 64 attention): their ratios to it were 1.020× / 1.028× (H200,
# session 26). Then transformer-350m on the old D 64 tiles (--kernel-changes). On an H100 JAX
# must hold 95 % of the memory for the remat-none steps (≈ 50–55 GiB).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
filt() { grep -v "^W12\|^I12\|^E12"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
OLD='flash_attention:block_k=32,num_stages=4,block_k_dq=64,block_k_dkv=128,forward_one_select=False,diagonal_causal_only=False'
timeout 230 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m --torch "" --unpacked "" \
    --steps 4 --remat none --time-limit 210 --out $OUT/tt340.json > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | grep "^transformer\|^gdn\|^nha" | cut -c1-200
timeout 100 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m --torch "" --unpacked "" --steps 4 --remat none \
    --kernel-changes "$OLD" --out $OUT/tt350_old.json > $OUT/logs/tt350_old.log 2>&1
echo "tt350 old tiles rc=$?"; filt < $OUT/logs/tt350_old.log | grep "^transformer\|changed" | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
