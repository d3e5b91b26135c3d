#!/bin/bash
# Gated delta rule kernels, round 2 (pallas_kernels/delta_rule/NOTES.md): the bf16 check
# against the float32 per-token reference on the GPU (values and every gradient, < 1e-2), then
# the pallas rung's fwd and fwd+bwd at 4x8192 and 8x4096 (H16, K = V = 128, bf16) next to
# cuDNN causal attention, in the harness of results/linear1 (its rows: 1.68 / 6.46 ms and
# 1.49 / 5.99 ms before this round). About 2.5 min; no fla needed.
cd "$(dirname "$0")/../../../.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-.}"
timeout 80 python -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
    --out "$OUT/delta_rule_check.json" 2>&1 | tee "$OUT/delta_rule_check.log"
timeout 95 python -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --no-fla --shapes 4x8192,8x4096 --time-limit 85 \
    --out "$OUT/linear_ops.json" 2>&1 | tee "$OUT/linear_ops.log"
