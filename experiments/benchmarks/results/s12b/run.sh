#!/bin/bash
# Session 12, call b (issues 15, 14): GDN Round 10's winners as the defaults
# (default_block_sizes from K 128): the GPU accuracy check (also the forward alone, now split
# at K 128), per-kernel times at K 128 and gdn-340m's K 256, then gdn-340m against
# transformer-350m in full train steps on packed WikiText-2 at T 8192 (session 10: 0.82x).
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 110 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 90 \
    --out $OUT/check.json > $OUT/check.log 2>&1
echo "check rc=$?"; filt $OUT/check.log | grep -v "^{" | cut -c1-170 | tail -8
for shape in 4x8192 gdn-340m@4x8192; do
  timeout 100 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule --shape $shape \
      --out $OUT/ours_$shape.json > $OUT/ours_$shape.log 2>&1
  echo "ours $shape rc=$?"; filt $OUT/ours_$shape.log | grep -v "^{" | tail -16
done
timeout 280 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 260 --out $OUT/train_wikitext_8192.json \
    > $OUT/train_wikitext_8192.log 2>&1
echo "train rc=$?"; filt $OUT/train_wikitext_8192.log | tail -8
