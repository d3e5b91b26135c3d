#!/bin/bash
# Session 22, call h: the RMSNorm kernels with the SiLU inside (GSA's / NHA's output norm
# n(silu(o))·γ): GPU check and table; then nha-hybrid-340m's step profiled with it (call f:
# the same step with the SiLU as an XLA pass before the plain norm kernel).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 170 python3 -m experiments.benchmarks.rms_norm --parts check,table --budget-s 90 \
    --out $OUT/rms_norm.json > $OUT/rms_norm.log 2>&1
echo "rms_norm rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/rms_norm.log | cut -c1-200 | tail -34
timeout 240 python3 -m experiments.benchmarks.profile_step --model nha-hybrid-340m \
    --length 8192 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --top 90 \
    --remat none --out $OUT/profile_nha_hybrid.json > $OUT/profile_nha_hybrid.log 2>&1
echo "profile rc=$?"; grep -v "^W12\|^I12" $OUT/profile_nha_hybrid.log | head -6 | cut -c1-160
