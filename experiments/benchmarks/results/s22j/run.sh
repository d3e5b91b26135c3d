#!/bin/bash
# Session 22, call j: SSD `grads_skip` (chunk_grads adds Mamba-2's D·dy to dx): the GPU check
# with it in every case, then mamba2-340m's step profiled with it (call g: the same step
# without it, the same tree otherwise).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --check-changes grads_skip=True --out $OUT/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "check rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/ssd_check.log | cut -c1-200 | tail -12
timeout 210 python3 -m experiments.benchmarks.profile_step --model mamba2-340m \
    --length 8192 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 \
    --remat none --kernel-changes 'ssd:grads_skip=True' \
    --out $OUT/profile_mamba2.json > $OUT/profile_mamba2.log 2>&1
echo "profile rc=$?"; grep -v "^W12\|^I12" $OUT/profile_mamba2.log | head -24 | cut -c1-160
