#!/bin/bash
# Linear-mixer kernels, call 2 (issue 15): SSD round 2 (pallas_kernels/ssd/NOTES.md), the gated
# delta rule and GSA pallas rungs, fla's chunk kernels at 4x8192 then 8x4096 for all three ops.
# Needs fla (fla-core 0.6) importable (the usual wheel prefix). Every row is printed as it is
# measured and $OUT/linear_ops.json rewritten after each, so a cut-off run keeps its rows.
cd "$(dirname "$0")/../../../.."
export PYTHONUNBUFFERED=1
timeout 270 python -m experiments.benchmarks.linear_ops --parts check,table \
    --shapes 4x8192,8x4096 --impls pallas --fla-timeout 170 --time-limit 262 \
    --out "${OUT:-.}/linear_ops.json" 2>&1 | tee "${OUT:-.}/linear_ops.log"
