#!/bin/bash
# Session 10, call f: transformer-125m's unscanned step with the one-pass loss (the row maximum,
# its index and the sum of exponentials in one reduction over the float32 logits; call d: two
# reductions, 1.08 + 0.96 ms a step, 67.64 ms a step untraced).
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 150 python3 -m experiments.benchmarks.profile_step --model transformer-125m --length 2048 \
    --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
    --no-scan --top 30 --out $OUT/profile_125m.json > $OUT/profile_125m.log 2>&1; echo "profile rc=$?"
filt $OUT/profile_125m.log | grep -A40 "^== " | head -45
