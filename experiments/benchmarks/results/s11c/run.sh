#!/bin/bash
# Session 11, call c (issue 15): the NHA kernel against the fla chunk_gsa + flex-attention
# composition, fwd+bwd in the same run at last (fla's chunk_gsa tuned from call b's Triton
# cache, carried as .gpu/triton_fla.tgz), beside cuDNN's sliding window; and the SSD kernel's
# variants against fla's chunk_simple_gla forward in the same run.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
tar xzf .gpu/triton_fla.tgz -C /tmp && ls /tmp/triton_fla | wc -l
timeout 330 python3 -m experiments.benchmarks.nha_kernel --parts table --table-variants "" \
    --fla-cache /tmp/triton_fla --peer-timeout 220 --out $OUT/nha_table.json > $OUT/nha_table.log 2>&1
echo "nha rc=$?"
filt $OUT/nha_table.log | grep -v "^{" | tail -16
grep "^peer" $OUT/nha_table.log | cut -c1-600
timeout 150 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --variants all --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 60 --time-limit 140 \
    --out $OUT/ssd_variants.json > $OUT/ssd_variants.log 2>&1
echo "ssd rc=$?"
filt $OUT/ssd_variants.log | grep -v "^{" | tail -14
