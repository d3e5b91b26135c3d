#!/bin/bash
# Issue 14, flash-attention kernel version 2 (one device call, ~5.5 min): the GPU accuracy check
# (bf16 vs a float32 reference with segment ids), the BlockSizes sweep per head dim, the kernel
# table against cuDNN (with the swept blocks), then the 125M train step profiled, packed text
# against unpacked random tokens. Needs .devdata/wikitext2_bpe32k.npz (made on the dev machine:
# python -m experiments.benchmarks.packed_data ../shared/data/wikitext-2-raw/wiki.train.raw
# .devdata/wikitext2_bpe32k.npz); carry .devdata with the worktree.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flash2}; mkdir -p $OUT
timeout 280 python3 -m experiments.benchmarks.flash_attention --parts check,sweep,table \
    --shapes 125m,d128,d256 --sweep-seconds 35 --skip xla,swa \
    --out $OUT/fa.json > $OUT/fa.log 2>&1
timeout 70 python3 -m experiments.benchmarks.profile_step --model transformer-125m --length 2048 \
    --data .devdata/wikitext2_bpe32k.npz --modes packed,unpacked --steps 5 \
    --trace-dir /tmp/flash2_traces --out $OUT/profile.json > $OUT/profile.log 2>&1
grep -v "^{" $OUT/fa.log | tail -75; grep -v "^{" $OUT/profile.log | tail -90
