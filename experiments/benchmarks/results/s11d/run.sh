#!/bin/bash
# Session 11, call d (issue 15): SSD round 4, the chunk scores C·Bᵀ formed once per group and
# chunk (now the GPU default, `shared_scores`) against recomputing them in every program
# ("recomputed scores", the previous default), fla's chunk_simple_gla forward in the same run
# (call b's Triton cache); mamba2-340m's shape too; then the GPU accuracy check of the default.
# From the repo root, carrying .whl and .gpu.
# (The shared_scores option and these variant labels were removed after this call: slower, NOTES.md round 4.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 280 python3 -m experiments.benchmarks.linear_ops --parts check,table --ops ssd --impls pallas \
    --variants 'recomputed scores;shared scores P32;grads 2 stages;segments 2' \
    --shapes 4x8192,mamba2-340m@4x8192 --fla-cache /tmp/triton_fla --fla-timeout 60 --time-limit 270 \
    --out $OUT/ssd_shared.json > $OUT/ssd_shared.log 2>&1
echo "ssd rc=$?"
filt $OUT/ssd_shared.log | grep -v "^{" | tail -30
