#!/bin/bash
# Session 45, call c (carry .whl): the heads-for-time check on one GPU (head_split_check.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 experiments/benchmarks/results/s45c/head_split_check.py > $OUT/head_split.log 2>&1
echo "rc=$?"; grep -v "^W12\|^I12\|^E12" $OUT/head_split.log | tail -8 | cut -c1-400
