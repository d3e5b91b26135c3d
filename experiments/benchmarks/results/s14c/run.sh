#!/bin/bash
# Session 14, call c: GPU check of GDN's K 128 pipelined key gradients (now default); the GDN
# and SSD tables with 0.5 s of warm-up on both sides (timing.WARMUP_S) and fla's fastest of
# two processes; NHA: main against branch nha-waits (slot kernels read every tile before the
# first product; its chunk_math.py carried untracked as _r14/chunk_math.py), kernel times;
# then kernel time (profiler) of ours and fla's forwards.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla /tmp/j && tar xzf .gpu/triton_fla.tgz -C /tmp
trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out /tmp/j/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-190 | tail -3
timeout 130 python3 -m experiments.benchmarks.linear_ops --parts table \
    --ops gated_delta_rule,ssd --impls pallas --variants none --shapes gdn-340m@4x8192,4x8192 \
    --fla-cache /tmp/triton_fla --fla-timeout 60 --fla-runs 2 --time-limit 125 \
    --out /tmp/j/table.json > $OUT/table.log 2>&1
echo "table rc=$?"; filt $OUT/table.log | grep "^gated\|^ssd\|^attention\|^op \|^target" | cut -c1-120
( timeout 60 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape 4x8192 --top 8 --out /tmp/j/nha_main.json
  cp pallas_kernels/nha/chunk_math.py /tmp/chunk_math_main.py
  cp _r14/chunk_math.py pallas_kernels/nha/chunk_math.py
  timeout 60 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape 4x8192 --top 8 --out /tmp/j/nha_waits.json
  timeout 100 python3 -m experiments.benchmarks.nha_kernel --check --check-variants "" \
    --out /tmp/j/nha_check.json; cp /tmp/chunk_math_main.py pallas_kernels/nha/chunk_math.py ) > $OUT/nha.log 2>&1
echo "nha rc=$?"; filt $OUT/nha.log | grep "ms of kernels\|check\|PASS\|FAIL" | cut -c1-160
export TRITON_CACHE_DIR=/tmp/triton_fla TRITON_CACHE_AUTOTUNING=1
timeout 40 python3 -m experiments.benchmarks.peers.fla_linear --profile \
    --ops gated_delta_rule,ssd --shapes gdn-340m@4x8192,4x8192 > $OUT/kernels.log 2>&1
unset TRITON_CACHE_DIR TRITON_CACHE_AUTOTUNING
for s in gdn-340m@4x8192 4x8192; do timeout 50 python3 -m experiments.benchmarks.op_kernels \
    --ops gated_delta_rule,ssd --shape $s --top 6 --out /tmp/j/ours_$s.json; done >> $OUT/kernels.log 2>&1
echo "kernels rc=$?"; filt $OUT/kernels.log | grep "total_ms\|ms of kernels" | cut -c1-300
