#!/bin/bash
# Session 10, call b (issue 14): the hybrids against transformer-350m at T 32768 (B 1) on packed
# Gutenberg books (long documents: one shard, 64 documents of ~98k tokens, BPE 32768 trained on
# it), every model unscanned (the faster form on one GPU, session 9) and without remat.
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
D=.devdata/gutenberg00_bpe32k.npz
timeout 560 python3 -m experiments.benchmarks.train_throughput --data $D --lengths 32768 \
    --models transformer-350m,gdn-340m,nha-340m,nha-hybrid-340m,mamba2-340m,oryx-gdn-340m \
    --torch "" --unpacked "" --steps 4 --remat none --no-scan \
    --time-limit 470 --out $OUT/train_gutenberg_32768.json > $OUT/train_gutenberg_32768.log 2>&1
echo "train rc=$?"
filt $OUT/train_gutenberg_32768.log | tail -12
