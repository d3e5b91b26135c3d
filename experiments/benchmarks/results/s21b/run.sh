#!/bin/bash
# Session 21, call b (warm follow-up of a): the SSD GPU check with D (a's stopped at its inputs:
# one random key short), then where mamba2-340m's step goes with the skip in the kernel.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 150 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out $OUT/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | tail -8 | cut -c1-240
timeout 200 python3 -m experiments.benchmarks.profile_step --model mamba2-340m --length 8192 \
    --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
    --top 40 --out $OUT/profile_mamba2.json > $OUT/profile_mamba2.log 2>&1
echo "profile rc=$?"; filt $OUT/profile_mamba2.log | grep -A8 "^category" | head -9
