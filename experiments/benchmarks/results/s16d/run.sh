#!/bin/bash
# Session 16, call d: nha-hybrid-340m on packed WikiText-2 at T 8192 with the NHA op's
# 'attention' rung (idle slots: its full-window layers run ops.attention's flash kernel);
# NHA v8's tiled slot-input kernels ('slot_inputs_tiled') against today's default
# ('slot_bwd_split_w4') and their GPU check; gdn-340m with the session's GDN defaults last
# (it may run out of the session's device time). From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
train() {
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/train_$1.json >> $OUT/train.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/train.log | grep "^$1\|^model" | tail -2 | cut -c1-250
}
train nha-hybrid-340m 135
timeout 80 python3 -m experiments.benchmarks.nha_kernel --parts sweep \
    --variants slot_bwd_split_w4,slot_inputs_tiled --budget-s 70 --peer-timeout 1 \
    --out /tmp/j/nha_sweep.json > $OUT/nha.log 2>&1
echo "nha sweep rc=$?"; filt $OUT/nha.log | grep -v "^{" | tail -4 | cut -c1-150
timeout 110 python3 -m experiments.benchmarks.nha_kernel --check --check-variants slot_inputs_tiled \
    --budget-s 100 --out /tmp/j/nha_check.json >> $OUT/nha.log 2>&1
echo "nha check rc=$?"; filt $OUT/nha.log | grep "PASS\|FAIL\|slot_inputs_tiled" | cut -c1-170 | tail -4
train gdn-340m 130
