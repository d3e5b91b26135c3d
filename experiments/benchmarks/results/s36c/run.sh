#!/bin/bash
# Session 36, call c (carry .whl, .devdata with gutenberg00_bpe32k.npz). s36b: mamba2-130m at
# B 1 × T 32768 runs 14 % below B 4 × T 8192 (278,304 against 324,261 tokens/s). Its SSD runs
# S = 4 sequence segments there (`segments.choose_segments`: 24 heads · 4 ≤ 132 SMs at one
# program an SM); rows at S = 2, 8 (192 programs) forced, and mamba2-340m (32 heads, S 4) at
# S 8 against its default.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
row() {  # name, model, length, seconds, kernel changes
  timeout $4 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
      --lengths $3 --models $2 --time-limit $(($4 - 10)) ${5:+--kernel-changes "$5"} \
      --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^mamba" $OUT/$1.log | cut -c1-150
}
row s4 mamba2-130m 32768 90
row s2 mamba2-130m 32768 90 'ssd:segments=2'
row s8 mamba2-130m 32768 90 'ssd:segments=8'
row l_s4 mamba2-340m 32768 150
row l_s8 mamba2-340m 32768 150 'ssd:segments=8'
cd $OUT && tar czf logs.tgz *.log && rm *.log
