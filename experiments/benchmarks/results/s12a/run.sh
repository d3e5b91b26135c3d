#!/bin/bash
# Session 12, call a (issue 15): GDN Round 10 measured. The forward sequential kernel's own
# V tile / warps / stages, the entering state stored first, and the reverse pass's small
# scales at one stage (pallas_kernels/delta_rule/NOTES.md Round 10), at gdn-340m's K 256 and
# at K 128, fla's forward in the same run (its tuned cache carried as .gpu/triton_fla.tgz);
# then the per-kernel times of the same variants.  From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
K256='forward 1 stage;forward 4 warps;forward 1 stage 4 warps;state stored first;reverse 1 stage;reverse small scales 1 stage;forward 1 stage, reverse small scales;forward 1 stage 4 warps, reverse small scales'
K128='forward V64;forward V64 4 stages;state stored first;forward V64 4 stages, state first;reverse 1 stage;reverse small scales 1 stage;forward V64 4 stages, reverse small scales'
for pair in "k256|gdn-340m@4x8192|$K256" "k128|4x8192|$K128"; do
  IFS='|' read name shape labels <<< "$pair"
  timeout 250 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
      --impls pallas --variants "$labels" --shapes $shape --fla-cache /tmp/triton_fla \
      --fla-timeout 40 --time-limit 240 --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$?"
  filt $OUT/$name.log | grep -v "^{" | cut -c1-150 | tail -14
done
