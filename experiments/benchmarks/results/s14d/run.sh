#!/bin/bash
# Session 14, call d (issue 14): where gdn-340m's and transformer-350m's packed WikiText-2 step
# goes now (unscanned, no remat, T 8192; last profiled in session 9 at 0.82x), then both on
# Gutenberg books at T 8192 after the session's kernels (session 10: 1.08x).
# From the repo root, carrying .whl and .devdata (no .gpu: the 64 MiB carry limit).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
for m in gdn-340m transformer-350m; do
  timeout 110 python3 -m experiments.benchmarks.profile_step --model $m --length 8192 \
      --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
      --no-scan --top 30 --out /tmp/j/profile_$m.json > $OUT/profile_$m.log 2>&1
  echo "profile $m rc=$?"; filt $OUT/profile_$m.log | grep -A12 "^category" | head -14
done
timeout 150 python3 -m experiments.benchmarks.train_throughput --data .devdata/gutenberg00_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 140 --out /tmp/j/train_gutenberg_8192.json \
    > $OUT/train_gutenberg.log 2>&1
echo "train rc=$?"; filt $OUT/train_gutenberg.log | tail -4 | cut -c1-250
