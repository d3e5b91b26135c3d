#!/bin/bash
# Session 21, call h (cold): where transformer-350m's step goes on packed WikiText-2 at T 8192,
# beside call b's mamba2-340m profile (where the hybrid's 23 ms a step go).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m experiments.benchmarks.profile_step --model transformer-350m --length 8192 \
    --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
    --top 30 --out $OUT/profile_transformer.json > $OUT/profile_transformer.log 2>&1
echo "profile rc=$?"; grep -v "^W12\|^I12" $OUT/profile_transformer.log | grep -B3 -A8 "^category" | head -14
