#!/bin/bash
# Session 34, call d (carry .whl, .devdata with gutenberg00_bpe32k.npz): where gdn-340m's and
# mamba2-340m's 22-24 % go from B 4 × T 8192 to B 1 × T 32768 (the same 32768 tokens a step;
# s34b). Kernel times a step: gdn-340m at both shapes, mamba2-340m at 32768 (8192: session 22).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
prof() {  # model, length, seconds
  timeout $3 python3 -m experiments.benchmarks.profile_step --model $1 --length $2 \
      --data .devdata/gutenberg00_bpe32k.npz --modes packed --steps 3 --remat none --top 25 \
      --out $OUT/$1_$2.json > $OUT/$1_$2.log 2>&1
  echo "profile $1 $2 rc=$?"; grep -v "^W12\|^I12\|^E12" $OUT/$1_$2.log | head -32 | cut -c1-150
}
prof gdn-340m 32768 130
prof gdn-340m 8192 120
prof mamba2-340m 32768 170
