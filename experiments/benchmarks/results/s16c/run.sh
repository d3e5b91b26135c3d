#!/bin/bash
# Session 16, call c: GDN Round 22's options (reverse pass in flight; key gradients with one
# state loop) by kernel time at gdn-340m's shape, and the first one's GPU check; the norm
# kernels' block-size variants at mamba2-340m's and gdn-340m's output norms (check and table);
# mamba2-340m on packed WikiText-2 at T 8192 after call b's SSD chunk_grads default.
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
V='reverse in flight;reverse in flight one tile;key gradients one state loop;key gradients one state loop 3 stages'
timeout 120 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --variants "$V" --top 7 --out /tmp/j/gdn_kernels.json \
    > $OUT/kernels.log 2>&1
echo "gdn op_kernels rc=$?"; filt $OUT/kernels.log | grep "ms of kernels\|^gated_delta_rule_chunk_\(key\|state_grad\|pair\)\|Error" | cut -c1-120
timeout 75 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
    --variant 'reverse in flight' --out /tmp/j/gdn_check.json >> $OUT/kernels.log 2>&1
echo "gdn check rc=$?"; filt $OUT/kernels.log | grep "check: \|  True\|  False" | cut -c1-190 | tail -6
N='backward rows x2;backward rows x2, 4 steps;backward 3 stages;backward 4 warps;forward rows x2'
timeout 100 python3 -m experiments.benchmarks.rms_norm --parts check,table --variants "$N" \
    --budget-s 80 --out /tmp/j/rms_norm.json > $OUT/norms.log 2>&1
echo "norms rc=$?"; filt $OUT/norms.log | grep -v "^{" | cut -c1-175 | tail -40
timeout 140 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models mamba2-340m --torch "" --unpacked "" --steps 4 --remat none \
    --time-limit 135 --out /tmp/j/train_mamba2-340m.json > $OUT/train.log 2>&1
echo "train rc=$?"; filt $OUT/train.log | grep "^mamba\|^model" | tail -2 | cut -c1-250
