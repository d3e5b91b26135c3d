#!/bin/bash
# Session 37, call e (carry .whl, .devdata): on an H200 only (the target card; an H100 exits at
# once), issue 14's transformer-125m row against the PyTorch peer at T 2048 on packed
# WikiText-2 and unpacked random tokens (s33b's command; H200 last: 1.38-1.39x the peer).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case $gpu in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
timeout 420 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 2048 --models transformer-125m --torch transformer-125m --unpacked transformer-125m \
    --steps 6 --out $OUT/train_125m.json > $OUT/train_125m.log 2>&1
echo "rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/train_125m.log | tail -8 | cut -c1-230
