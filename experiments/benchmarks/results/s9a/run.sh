#!/bin/bash
# Session 9, call a (issue 14): the short-conv kernels' first full GPU check, table and sweep
# (with the backward's tile-shaped dw/db sums), then gdn-340m vs transformer-350m at T 8192 on
# packed WikiText-2 without remat (the convs' and gated norm's recompute should let gdn-340m
# fit), and gdn-340m with the short-conv kernels forced.
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 170 python3 -m experiments.benchmarks.short_conv --budget-s 90 --out $OUT/short_conv.json > $OUT/short_conv.log 2>&1; echo "short_conv rc=$?"
filt $OUT/short_conv.log | tail -45
D=.devdata/wikitext2_bpe32k.npz
timeout 170 python3 -m experiments.benchmarks.train_throughput --data $D --lengths 8192 \
    --models gdn-340m,transformer-350m --torch "" --unpacked "" --steps 4 --remat none \
    --time-limit 150 --out $OUT/train_none.json > $OUT/train_none.log 2>&1; echo "train none rc=$?"
filt $OUT/train_none.log | tail -6
timeout 110 python3 -m experiments.benchmarks.train_throughput --data $D --lengths 8192 \
    --models gdn-340m --torch "" --unpacked "" --steps 4 --remat none --conv pallas \
    --time-limit 90 --out $OUT/train_conv.json > $OUT/train_conv.log 2>&1; echo "train conv rc=$?"
filt $OUT/train_conv.log | tail -4
