#!/bin/bash
# Session 18, call c: the GPU checks and timings of two helpers' default-off options for
# mamba2-340m's two slowest kernels: SSD chunk_grads' summed score gradients
# (grads_summed_scores) and the gated norm's backward (joint sums, half rows at 8 warps);
# then mamba2-340m on packed WikiText-2 without and with both (patched_train.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
HERE=experiments/benchmarks/results/s18c
timeout 110 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --check-changes grads_summed_scores=True --out /tmp/j/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-200 | tail -7
V='backward 8 warps, rows /2, joint sums;backward 8 warps, rows /2, joint sums, 42 steps;backward 4 warps, rows /2, joint sums, prefetch'
timeout 170 python3 -m experiments.benchmarks.rms_norm --parts check,table --budget-s 150 \
    --variants "$V" --out /tmp/j/rms_norm.json > $OUT/rms_norm.log 2>&1
echo "rms_norm rc=$?"; filt $OUT/rms_norm.log | grep -v "^{" | cut -c1-200 | tail -24
train() {  # label, seconds, module
  timeout $2 python3 -m $3 --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models mamba2-340m --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/train_$1.json >> $OUT/train_$1.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/train_$1.log | grep "^mamba2\|^model" | tail -2 | cut -c1-200
}
train default 135 experiments.benchmarks.train_throughput
train both 135 experiments.benchmarks.results.s18c.patched_train
