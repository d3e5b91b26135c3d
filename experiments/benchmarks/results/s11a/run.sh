#!/bin/bash
# Session 11, call a (issue 15): GDN Round 8 (fewer warps a sequential program; NOTES.md)
# at gdn-340m's K 256 and at K 128, no fla; and the lowering question: JAX's own Mosaic GPU
# attention (Hopper warp-group MMAs) beside cuDNN and our Triton-lowered flash kernel.
# From the repo root, carrying .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 260 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule --impls pallas \
    --shapes gdn-340m@4x8192,4x8192 --no-fla --time-limit 240 \
    --variants 'sequential 4 warps;sequential 2 warps;sequential 2 warps 3 stages;sequential 2 warps V16' \
    --out $OUT/gdn_round8.json > $OUT/gdn_round8.log 2>&1
echo "gdn rc=$?"
filt $OUT/gdn_round8.log | tail -16
timeout 200 python3 -m experiments.benchmarks.flash_attention --parts table --shapes 125m,d128 \
    --skip xla,swa --out $OUT/fa_mosaic.json > $OUT/fa_mosaic.log 2>&1
echo "fa rc=$?"
filt $OUT/fa_mosaic.log | tail -14
