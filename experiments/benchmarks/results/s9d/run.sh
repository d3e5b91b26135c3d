#!/bin/bash
# Session 9, call d (issues 14, 16). Call c's XLA log put PHA's "stall" in ptxas: the unscanned
# model init's fused Threefry draws (one fusion 44 s). Now the init compiles with the Threefry
# kernel on one GPU (hybrid_jax/nn/init_random.py): check it draws the same bits and time it,
# then PHA's and attention-only's inference rows, then gdn-340m unscanned without remat (call
# b: 44 ms a step of memcpy into the layer scan's stacked residuals).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 120 python3 -m experiments.benchmarks.init_compile --fused-limit-s 25 \
    --out $OUT/init_compile.json > $OUT/init_compile.log 2>&1; echo "init rc=$?"
filt $OUT/init_compile.log | tail -7
timeout 135 python3 -m experiments.benchmarks.pha_efficiency --models pha-180m,attention-only-180m \
    --parts inference --lengths 8192 --time-limit 125 --out $OUT/pha_inference.json > $OUT/pha_inference.log 2>&1; echo "pha rc=$?"
filt $OUT/pha_inference.log | grep -v "^  File" | tail -14
timeout 125 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models gdn-340m --torch "" --unpacked "" --steps 4 --remat none --no-scan \
    --time-limit 115 --out $OUT/train_noscan.json > $OUT/train_noscan.log 2>&1; echo "train rc=$?"
filt $OUT/train_noscan.log | grep -v '^{' | tail -4
