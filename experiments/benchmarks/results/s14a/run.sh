#!/bin/bash
# Session 14, call a (issue 15): GPU check of Round 17 (K 128 state pass reads each tile where
# first used, the default); the K 128 output/state-pass labels and the pipelined key gradients
# at gdn-340m's shape; SSD round 6's decays-first / stage labels; fla's forward by event time
# (twice) and by kernel time (profiler); GDN's kernels at gdn-340m's shape.
# From the repo root, carrying .whl and .gpu. Logs under $OUT, JSON in one tgz (8-file limit).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla /tmp/j && tar xzf .gpu/triton_fla.tgz -C /tmp
trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out /tmp/j/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 90 \
    --variants 'state stored first;forward key blocks;state first outputs K64;forward key blocks outputs K64;forward key blocks outputs V64 K64;outputs V128 K64 3 stages' \
    --out /tmp/j/gdn128.json > $OUT/gdn128.log 2>&1
echo "gdn128 rc=$?"; filt $OUT/gdn128.log | grep "^gated\|^attention\|^op " | cut -c1-110
timeout 70 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --shapes gdn-340m@4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 \
    --time-limit 60 --variants 'key gradients pipelined 3 stages;key gradients pipelined 2 stages' \
    --out /tmp/j/gdn256.json > $OUT/gdn256.log 2>&1
echo "gdn256 rc=$?"; filt $OUT/gdn256.log | grep "^gated\|^attention\|^op " | cut -c1-110
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts table --ops ssd --impls pallas \
    --shapes 4x8192 --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 90 \
    --variants 'decays first;fused 3 stages;decays first 3 stages;state pass, states 3 stages;state pass, states 4 stages;state pass, outputs 3 stages;state pass, both 3 stages' \
    --out /tmp/j/ssd.json > $OUT/ssd.log 2>&1
echo "ssd rc=$?"; filt $OUT/ssd.log | grep "^ssd\|^attention\|^op " | cut -c1-110
export TRITON_CACHE_DIR=/tmp/triton_fla TRITON_CACHE_AUTOTUNING=1
( for i in 1 2; do timeout 40 python3 -m experiments.benchmarks.peers.fla_linear \
    --ops gated_delta_rule,ssd --shapes gdn-340m@4x8192,4x8192 --iters 20; done
  timeout 40 python3 -m experiments.benchmarks.peers.fla_linear --profile \
    --ops gated_delta_rule,ssd --shapes gdn-340m@4x8192,4x8192 ) > $OUT/fla.log 2>&1
echo "fla rc=$?"; filt $OUT/fla.log | grep "^{" | cut -c1-400
unset TRITON_CACHE_DIR TRITON_CACHE_AUTOTUNING
timeout 80 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --out /tmp/j/op_kernels.json > $OUT/op_kernels.log 2>&1
echo "op_kernels rc=$?"; filt $OUT/op_kernels.log | cut -c1-150 | tail -40
