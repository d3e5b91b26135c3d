#!/bin/bash
# Session 34, call c (carry .whl, .devdata): the 340M rows at T 32768 (batch 1) on packed
# WikiText-2 (short articles, ≈ 13 a row: attention skips the blocks between documents, so the
# transformer's cost stays near-linear in T), beside s34b's books rows.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --torch '' --unpacked '' --steps 4 --remat none --lengths 32768 \
    --models transformer-350m,gdn-340m,nha-340m,mamba2-340m --time-limit 480 \
    --out $OUT/wiki32768.json > $OUT/wiki32768.log 2>&1
echo "wiki32768 rc=$?"; grep "^transformer\|^gdn\|^nha\|^mamba" $OUT/wiki32768.log | cut -c1-220
