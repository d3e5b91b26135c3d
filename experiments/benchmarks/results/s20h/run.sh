#!/bin/bash
# Session 20, call h (cold, last of the budget): transformer-125m against the PyTorch peer at
# T 2048 with RoPE's new backward: tokens/s, MFU (issue 14's 45 % target), packed vs unpacked.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 190 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 2048 --models transformer-125m --torch transformer-125m --unpacked transformer-125m \
    --steps 6 --out $OUT/train_125m.json > $OUT/train_125m.log 2>&1
echo "rc=$?"; grep -v "^W12\|^I12\|^{" $OUT/train_125m.log | tail -6 | cut -c1-230
