#!/bin/bash
# Session 13, call a (issue 15): GDN Rounds 12-13 as defaults on the GPU check and timed at
# both shapes with fla's forward in the same run; Round 14 (branch gdn-cumsum rebased on main,
# carried untracked as _r14/pallas_kernels) checked and timed the same way; per-kernel times.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
mkdir -p /tmp/r14tree && cp -r hybrid_jax experiments /tmp/r14tree/ && cp -r _r14/pallas_kernels /tmp/r14tree/
ROOT=$PWD
table() {  # $1 tag, run from the current directory
  timeout 150 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants none --shapes gdn-340m@4x8192,4x8192 \
    --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 140 --out $OUT/$1.json \
    > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; filt $OUT/$1.log | grep "^gated\|^op " | cut -c1-150
}
check() {
  timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; filt $OUT/$1.log | grep -v "^{" | cut -c1-190 | tail -7
}
check check_main
table table_main
cd /tmp/r14tree && export PYTHONPATH=/tmp/site:/tmp/r14tree
check check_r14
table table_r14
cd $ROOT && export PYTHONPATH=/tmp/site:$ROOT
timeout 80 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --out $OUT/kernels_k256.json > $OUT/kernels_k256.log 2>&1
echo "kernels rc=$?"; filt $OUT/kernels_k256.log | grep -v "^{" | tail -12
