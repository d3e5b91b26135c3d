#!/bin/bash
# Session 34, call f (prepared, not run: the session's device time ran out; carry .whl and a
# .devdata holding gutenberg00_bpe32k.npz). gdn-340m at B 1 × T 32768 loses 24 % to B 4 × T
# 8192, all of it in the two sequential state passes at a quarter of the programs (s34d: 3
# heads × 8 V tiles of 64 = 24 programs for 132 SMs). The cheapest lever: V tiles of 32 in both
# passes (48 programs). Session 7 found narrower tiles lost 2 ms of 8 at B 4 (12 sequences);
# at B 1 (3 sequences) the passes are 3.7× slower than at B 4, which V 32 may halve.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
row() {  # name, kernel changes
  timeout 200 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
      --lengths 32768 --models gdn-340m --time-limit 180 ${2:+--kernel-changes "$2"} \
      --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^gdn" $OUT/$1.log | cut -c1-200
}
row default
row v32 'delta_rule:value_block=32,forward_value_block=32'
