#!/bin/bash
# Session 22, call g: mamba2-340m's step profiled with the global gradient norm's small leaves
# in one reduction (this tree; Mamba-2's layer as in 03af2cb), beside call b's profile of
# 03af2cb; then its tokens/s row.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 280 python3 -m experiments.benchmarks.profile_step --model mamba2-340m \
    --length 8192 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 \
    --remat none --out $OUT/profile_mamba2.json > $OUT/profile_mamba2.log 2>&1
echo "profile rc=$?"; grep -v "^W12\|^I12" $OUT/profile_mamba2.log | head -10 | cut -c1-160
