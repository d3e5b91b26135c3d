#!/bin/bash
# Session 12, call c (issue 15): the GPU accuracy check again (call b's float32 case asked
# 280 KB of shared memory: float32 now keeps the earlier defaults), then from the new
# defaults: the forward state pass in V tiles of 64 at K 256, and the key-gradient kernel's
# K tile (COMPILED.md's suggestion 5 at K 256; one program a chunk at K 128, where that
# kernel is now the largest, 0.95 of 2.87 ms). fla's forward in the same run.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 120 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 100 \
    --out $OUT/check.json > $OUT/check.log 2>&1
echo "check rc=$?"; filt $OUT/check.log | grep -v "^{" | cut -c1-190 | tail -8
K256='forward V64;forward V64 2 stages;gradients K32;state stored first'
K128='gradients K128;gradients K128 8 warps;gradients 8 warps;gradients V128;state stored first'
for pair in "k256|gdn-340m@4x8192|$K256" "k128|4x8192|$K128"; do
  IFS='|' read name shape labels <<< "$pair"
  timeout 200 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
      --impls pallas --variants "$labels" --shapes $shape --fla-cache /tmp/triton_fla \
      --fla-timeout 40 --time-limit 190 --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$?"
  filt $OUT/$name.log | grep "^gated\|^op " | cut -c1-150
done
