#!/bin/bash
# Session 20, call d (cold): the GDN and SSD forwards against fla in kernel time. Call b's wall
# ratios (ours: 5 back-to-back calls by the host clock, synchronised after the last; fla: CUDA
# events) leave ours paying its dispatch and sync; here both sides' forward kernels are summed
# from profiles: fla's by torch's profiler (`fla_linear --profile`, its autotune choices from
# the measured run's Triton cache), ours by `op_kernels` (the jax profiler), same call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
SHAPES=4x8192,gdn-340m@4x8192
timeout 300 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd,gated_delta_rule \
    --impls pallas --variants none --shapes $SHAPES --fla-cache /tmp/triton_fla --fla-warm 12 \
    --fla-runs 2 --fla-timeout 220 --time-limit 290 --out $OUT/linear_fla.json > $OUT/linear_fla.log 2>&1
echo "linear rc=$?"
filt $OUT/linear_fla.log | grep -v "^{\|^fla peer" | tail -12 | cut -c1-170
TRITON_CACHE_DIR=/tmp/triton_fla TRITON_CACHE_AUTOTUNING=1 timeout 120 python3 -m \
    experiments.benchmarks.peers.fla_linear --shapes $SHAPES --ops ssd,gated_delta_rule --profile \
    > $OUT/fla_profile.log 2>&1
echo "fla profile rc=$?"; cut -c1-600 $OUT/fla_profile.log | tail -4
for shape in 4x8192 gdn-340m@4x8192; do
  timeout 100 python3 -m experiments.benchmarks.op_kernels --ops ssd,gated_delta_rule --shape $shape \
      --top 8 --out $OUT/op_kernels_${shape/@/_}.json > $OUT/op_kernels_${shape/@/_}.log 2>&1
  echo "op_kernels $shape rc=$?"; grep "fwd: \|fwd+bwd: " $OUT/op_kernels_${shape/@/_}.log
done
