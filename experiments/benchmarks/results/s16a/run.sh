#!/bin/bash
# Session 16, call a: GDN Round 21's 'pair gradients pipelined' (table against the default, GPU
# check, kernel time); where mamba2-340m's and nha-hybrid-340m's packed WikiText-2 steps go
# (T 8192, unscanned, no remat; 0.80x / 0.75x the transformer). From the repo root, carrying
# .whl and .devdata (fla's Triton cache is not needed: --no-fla).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
V='pair gradients pipelined'
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --no-fla --shapes gdn-340m@4x8192,4x8192 --variants "$V" --time-limit 95 \
    --out /tmp/j/table.json > $OUT/kernels.log 2>&1
echo "table rc=$?"; filt $OUT/kernels.log | grep "^gated\|^attention\|^op \|^target" | cut -c1-130
timeout 75 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
    --variant "$V" --out /tmp/j/gdn_check.json >> $OUT/kernels.log 2>&1
echo "gdn check rc=$?"; filt $OUT/kernels.log | grep "check: \|  True\|  False" | cut -c1-190 | tail -6
timeout 70 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --variants "$V" --top 8 --out /tmp/j/op_kernels.json \
    > $OUT/op_kernels.log 2>&1
echo "op_kernels rc=$?"; filt $OUT/op_kernels.log | cut -c1-150 | grep -v "^{" | tail -32
for m in mamba2-340m nha-hybrid-340m; do
  timeout 145 python3 -m experiments.benchmarks.profile_step --model $m --length 8192 \
      --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
      --top 30 --out /tmp/j/profile_$m.json > $OUT/profile_$m.log 2>&1
  echo "profile $m rc=$?"; filt $OUT/profile_$m.log | grep -A12 "^category" | head -14
done
