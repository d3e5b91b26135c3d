#!/bin/bash
# Session 12, call d (issue 15): gdn-340m's K 256 backward from the new defaults: the reverse
# state-gradient pass (the largest kernel, 1.47 ms, call b) at 4 warps now that its small
# scales leave room (8 warps issue its chained products twice, COMPILED.md), in V tiles of
# 64; the gradient kernels' V tile 128 (K 128: 2.91 -> 2.84, call c). fla's forward in the
# same run. From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 250 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'sequential 4 warps;reverse V64;reverse V64 4 warps;gradients V128' \
    --shapes gdn-340m@4x8192 --fla-cache /tmp/triton_fla --fla-timeout 40 --time-limit 240 \
    --out $OUT/k256.json > $OUT/k256.log 2>&1
echo "k256 rc=$?"; filt $OUT/k256.log | grep "^gated\|^op " | cut -c1-150
timeout 100 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --out $OUT/kernels_k256.json > $OUT/kernels_k256.log 2>&1
echo "kernels rc=$?"; filt $OUT/kernels_k256.log | grep -v "^{" | tail -12
