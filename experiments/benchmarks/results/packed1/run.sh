#!/bin/bash
# Packed flash attention and model throughput (issue 14), device call 3: the kernel with the
# unmasked interior and the new tiles next to cuDNN; then full train steps at T = 2048 for every
# model, the PyTorch peer, unpacked 125M and the unscanned 24-layer compile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
timeout 100 python3 -m experiments.benchmarks.flash_attention --parts table --shapes 125m,d128 \
    --out $OUT/fa.json > $OUT/fa.log 2>&1
DATA=""; [ -f data/wikitext2_bpe32k.npz ] && DATA="--data data/wikitext2_bpe32k.npz"
timeout 390 python3 -m experiments.benchmarks.train_throughput $DATA --lengths 2048 \
    --torch transformer-125m --unpacked transformer-125m --ablate transformer-125m \
    --compile-check transformer-350m \
    --time-limit 300 --out $OUT/tt.json > $OUT/tt.log 2>&1
grep -v "^{" $OUT/fa.log | tail -12; grep -v "^{" $OUT/tt.log | tail -30
