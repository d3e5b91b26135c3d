#!/bin/bash
# Session 17, call c: the new defaults' GPU checks and model runs. SSD with Mamba-2's D skip
# fused into its kernels (GPU check with D; mamba2-340m on packed WikiText-2 at T 8192);
# NHA at D 256 with the split slot backward and tiled slot inputs (the op check at D 256 with
# documents and a state; nha-340m on packed WikiText-2); GDN at K 64 (oryx-gdn-340m's heads)
# under Round 10+'s options, never measured there (op_kernels with documents).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out /tmp/j/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-190 | tail -6
train() {  # model, seconds
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/train_$1.json >> $OUT/train.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/train.log | grep "^$1\|^model" | tail -2 | cut -c1-250
}
train mamba2-340m 135
train nha-340m 130
timeout 100 python3 -m experiments.benchmarks.nha_kernel --check --check-variants "" \
    --budget-s 90 --out /tmp/j/nha_check.json > $OUT/nha_check.log 2>&1
echo "nha check rc=$?"; filt $OUT/nha_check.log | grep "PASS\|FAIL\|^op \|^api \|^gsa" | cut -c1-170 | tail -8
V='pair gradients pipelined;key gradients pipelined 3 stages;outputs V64 K64 3 stages;forward V64 4 stages;reverse small scales 1 stage'
timeout 100 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape oryx-gdn-340m@4x8192 --documents 1500 --variants "$V" --top 6 \
    --out /tmp/j/op_kernels_gdn64.json > $OUT/op_kernels_gdn64.log 2>&1
echo "gdn64 op_kernels rc=$?"; filt $OUT/op_kernels_gdn64.log | grep "ms of kernels\|Error" | cut -c1-140
