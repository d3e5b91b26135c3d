#!/bin/bash
# Session 22, call d: nha-hybrid-340m's step profiled (packed WikiText-2, T 8192), this tree.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 300 python3 -m experiments.benchmarks.profile_step --model nha-hybrid-340m \
    --length 8192 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 \
    --remat none --out $OUT/profile_nha_hybrid.json > $OUT/profile_nha_hybrid.log 2>&1
echo "profile rc=$?"; grep -v "^W12\|^I12" $OUT/profile_nha_hybrid.log | head -45 | cut -c1-160
