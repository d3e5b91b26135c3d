#!/bin/bash
# Session 11, call e (issue 15): the sequential loops are bound by each step's latency (call d:
# an extra L2 load a step cost more than the 1 MFLOP product it replaced). SSD round 4b: the
# forward's B, C, x tiles loaded one chunk ahead, carried in registers (`prefetch_tiles`), at
# 4 and 8 warps; GDN: its existing `prefetch` (the same for the sequential kernels) re-timed on
# today's kernels at K 128 and K 256; fla's forwards in the same run (call b's Triton cache).
# From the repo root, carrying .whl and .gpu.
# (The SSD prefetch_tiles option and its variant labels were removed after this call: slower, NOTES.md round 4.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 300 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd,gated_delta_rule \
    --impls pallas --variants 'prefetch tiles;prefetch tiles 8 warps;prefetch' \
    --shapes 4x8192,gdn-340m@4x8192 --fla-cache /tmp/triton_fla --fla-timeout 100 --time-limit 290 \
    --out $OUT/prefetch.json > $OUT/prefetch.log 2>&1
echo "rc=$?"
filt $OUT/prefetch.log | grep -v "^{" | cut -c1-140 | tail -22
