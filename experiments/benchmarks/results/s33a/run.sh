#!/bin/bash
# Session 33, call a (carry .whl, .devdata): issue 14's 340M rows at T 8192 on the target card
# (H200) after session 30's D 64 attention tiles, all four models in one process: transformer-350m,
# gdn-340m, nha-340m, mamba2-340m (H200 last measured in session 28: 1.015× / 1.021× / 0.896×).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
filt() { grep -v "^W12\|^I12\|^E12"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
timeout 400 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m --torch "" \
    --unpacked "" --steps 4 --remat none --time-limit 380 --out $OUT/tt340.json \
    > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | grep "^transformer\|^gdn\|^nha\|^mamba" | cut -c1-220
cd $OUT && tar czf logs.tgz logs && rm -rf logs
