#!/bin/bash
# Session 10, call d: where transformer-125m's unscanned step goes (issue 14's MFU target:
# 41.7 % of the matmul by 6N in call c), then transformer-350m and mamba2-340m unscanned on
# packed WikiText-2 at T 8192 (the same-run baseline for call c's NHA rows).
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
W=.devdata/wikitext2_bpe32k.npz
timeout 130 python3 -m experiments.benchmarks.profile_step --model transformer-125m --length 2048 \
    --tokens 32768 --data $W --modes packed --steps 3 --remat none --no-scan --top 30 \
    --out $OUT/profile_125m.json > $OUT/profile_125m.log 2>&1; echo "profile rc=$?"
filt $OUT/profile_125m.log | tail -50
timeout 200 python3 -m experiments.benchmarks.train_throughput --data $W --lengths 8192 \
    --models transformer-350m,mamba2-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 120 --out $OUT/train_wikitext_8192.json \
    > $OUT/train_wikitext_8192.log 2>&1
echo "wikitext rc=$?"; filt $OUT/train_wikitext_8192.log | tail -4
