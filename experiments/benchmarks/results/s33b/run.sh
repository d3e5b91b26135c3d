#!/bin/bash
# Session 33, call b (carry .whl, .devdata): transformer-125m against the PyTorch peer at T 2048
# on packed WikiText-2 and unpacked random tokens, on the target card after session 30's D 64
# tiles (H200 last: 1.38–1.39× the peer; H100 session 30: 1.44×, MFU 6N 0.405).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; mkdir -p $OUT
timeout 300 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 2048 --models transformer-125m --torch transformer-125m --unpacked transformer-125m \
    --steps 6 --out $OUT/train_125m.json > $OUT/train_125m.log 2>&1
echo "rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/train_125m.log | tail -8 | cut -c1-230
