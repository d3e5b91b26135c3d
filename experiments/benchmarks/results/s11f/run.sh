#!/bin/bash
# Session 11, call f (issue 15): where the GDN forward loses to fla, stage by stage: fla's
# forward kernels (torch profiler, `fla_linear --profile`) and ours (`op_kernels`), at K 128
# (4x8192) and at gdn-340m's K 256, same call; fla from call b's Triton cache.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
tar xzf .gpu/triton_fla.tgz -C /tmp
TRITON_CACHE_DIR=/tmp/triton_fla TRITON_CACHE_AUTOTUNING=1 timeout 120 python3 -m experiments.benchmarks.peers.fla_linear \
    --profile --ops gated_delta_rule,ssd --shapes 4x8192,gdn-340m@4x8192 > $OUT/fla_profile.jsonl 2> $OUT/fla_profile.err
echo "fla rc=$?"; cut -c1-900 $OUT/fla_profile.jsonl; tail -3 $OUT/fla_profile.err
for shape in 4x8192 gdn-340m@4x8192; do
  timeout 120 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule,ssd --shape $shape \
      --out $OUT/ours_$shape.json > $OUT/ours_$shape.log 2>&1
  echo "ours $shape rc=$?"; filt $OUT/ours_$shape.log | grep -v "^{" | tail -30
done
