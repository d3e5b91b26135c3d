#!/bin/bash
# Session 36, call d (carry .whl, .devdata with gutenberg00_bpe32k.npz). Where mamba2-130m's
# B 1 × T 32768 step loses 14 % against B 4 × T 8192 (s36b/s36c; its sequence segments are at
# their best S = 4): both steps profiled, kernels by category and by source function.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
for length in 32768 8192; do
  timeout 150 python3 -m experiments.benchmarks.profile_step --model mamba2-130m --length $length \
      --data .devdata/gutenberg00_bpe32k.npz --modes packed --steps 3 --remat none --top 30 \
      --out $OUT/mamba2-130m_$length.json > $OUT/mamba2-130m_$length.log 2>&1
  echo "profile $length rc=$?"; grep -v "^W12\|^I12\|^E12" $OUT/mamba2-130m_$length.log | head -40 | cut -c1-140
done
cd $OUT && tar czf logs.tgz *.log && rm *.log
