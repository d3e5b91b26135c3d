#!/bin/bash
# Session 10, call c: transformer-125m against the PyTorch peer with unscanned layers (issue 14's
# MFU target), PHA's training rows unscanned (issue 16), and the remaining 340M hybrids unscanned
# on packed WikiText-2 at T 8192 (short documents: 3.4 a row).
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
W=.devdata/wikitext2_bpe32k.npz
timeout 170 python3 -m experiments.benchmarks.train_throughput --data $W --lengths 2048 \
    --models transformer-125m --torch transformer-125m --unpacked transformer-125m --steps 6 \
    --no-scan --time-limit 150 --out $OUT/train_125m.json > $OUT/train_125m.log 2>&1
echo "125m rc=$?"; filt $OUT/train_125m.log | tail -5
timeout 170 python3 -m experiments.benchmarks.pha_efficiency --parts train --lengths 8192 \
    --no-scan --time-limit 150 --out $OUT/pha_efficiency.json > $OUT/pha_efficiency.log 2>&1
echo "pha rc=$?"; filt $OUT/pha_efficiency.log | tail -8
timeout 190 python3 -m experiments.benchmarks.train_throughput --data $W --lengths 8192 \
    --models nha-340m,nha-hybrid-340m,mamba2-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 160 --out $OUT/train_wikitext_8192.json \
    > $OUT/train_wikitext_8192.log 2>&1
echo "wikitext rc=$?"; filt $OUT/train_wikitext_8192.log | tail -5
