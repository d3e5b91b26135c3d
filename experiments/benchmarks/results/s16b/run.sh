#!/bin/bash
# Session 16, call b: SSD's chunk_grads launch at mamba2-340m's shape (H32 P64 N128: 1.33 ms a
# call, a quarter of its step in call a) with more stages / fewer warps, kernel times; the NHA
# window kernels' document bounds (full windows cost their documents): GPU check, then
# nha-hybrid-340m, nha-340m and transformer-350m on packed WikiText-2 at T 8192, one process a
# model. From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
V='default, grads 2 stages;default, grads 3 stages;default, grads 4 warps;default, grads 4 warps 2 stages'
timeout 110 python3 -m experiments.benchmarks.op_kernels --ops ssd --shape mamba2-340m@4x8192 \
    --variants "$V" --top 6 --out /tmp/j/ssd_kernels.json > $OUT/kernels.log 2>&1
echo "ssd op_kernels rc=$?"; filt $OUT/kernels.log | grep "ms of kernels\|^ssd_chunk_grads\|^ssd .*Error" | cut -c1-150
timeout 110 python3 -m experiments.benchmarks.nha_kernel --check --check-variants "" \
    --budget-s 100 --out /tmp/j/nha_check.json >> $OUT/kernels.log 2>&1
echo "nha check rc=$?"; filt $OUT/kernels.log | grep -i "check\|PASS\|FAIL\|  True\|  False" | cut -c1-170 | tail -12
for m in nha-hybrid-340m transformer-350m nha-340m; do
  timeout 135 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models $m --torch "" --unpacked "" --steps 4 --remat none --time-limit 130 \
      --out /tmp/j/train_$m.json >> $OUT/train.log 2>&1
  echo "train $m rc=$?"; filt $OUT/train.log | grep "^$m\|^model" | tail -2 | cut -c1-250
done
