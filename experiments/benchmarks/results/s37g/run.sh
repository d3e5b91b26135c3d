#!/bin/bash
# Session 37, call g (carry .whl): K 128's forward alone at V 32 / 64 (s37b/prefill.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 experiments/benchmarks/results/s37b/prefill.py --dim 128 \
    --field forward_value_block --tiles 32,64 --shapes 16x1x32768,16x2x16384,16x4x8192 2>&1 | grep -v "^[WIE]1"
