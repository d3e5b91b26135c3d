#!/bin/bash
# Call 1 (2026-12-01): the first H200 run of linear_ops (SSD round 1, an early gated delta
# rule kernel), from the tree of that day; the peer stopped at 100 s (fla not measured).
python -m experiments.benchmarks.linear_ops --parts check,sweep,table --time-limit 270 \
    --fla-timeout 100 --sweep-seconds 60 --out "$OUT/linear_ops.json"
