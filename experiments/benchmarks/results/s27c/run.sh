#!/bin/bash
# Session 27, call c (not run; for the next session, with .gpu/base27 = a35fc7e as in s27a,
# carry .whl and .gpu/base27): the delta-rule and SSD kernels' exponentials in base 2 (their
# NOTES, session 27; ptxas: SSD chunk_outputs -18 %, chunk_grads -13 % instructions and 416 ->
# 244 B of spills, GDN chunk_prepare -7 %). Kernel time per kernel, this tree against the one
# before: mamba2-340m's layer over packed documents (fwd+bwd), the gated delta rule at
# H16 K = V = 128 (forward alone, the fla comparison); then the GPU checks of both.
# Expected: ssd_chunk_grads / chunk_outputs a few to ~10 % faster; GDN forward 1-3 %.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
ops() {  # tree label op shape [flags]
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m experiments.benchmarks.op_kernels \
      --ops $3 --shape $4 $5 --top 10 --out $OUT/ops_$2.json > $OUT/logs/ops_$2.log 2>&1)
  echo "ops $2 rc=$?"; filt < $OUT/logs/ops_$2.log | grep -v "^{" | tail -26 | cut -c1-160
}
ops . new_ssd ssd mamba2-340m@4x8192 "--documents 1500 --skip-d"
ops .gpu/base27 base_ssd ssd mamba2-340m@4x8192 "--documents 1500 --skip-d"
ops . new_gdn gated_delta_rule 4x8192
ops .gpu/base27 base_gdn gated_delta_rule 4x8192
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out $OUT/check_ssd.json > $OUT/logs/check_ssd.log 2>&1
echo "check ssd rc=$?"; filt < $OUT/logs/check_ssd.log | grep -v "^{" | tail -8 | cut -c1-200
timeout 100 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
    --out $OUT/check_gdn.json > $OUT/logs/check_gdn.log 2>&1
echo "check gdn rc=$?"; filt < $OUT/logs/check_gdn.log | grep -v "^{" | tail -8 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
