#!/bin/bash
# Session 37, call c (carry .whl): gdn-130m's forward alone at three V tiles, reversed order (s37b/prefill.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 experiments/benchmarks/results/s37b/prefill.py --dim 64 \
    --field value_block --tiles 16,32,64 --shapes 12x1x32768,12x2x16384,12x4x8192,16x4x8192,16x8x4096 2>&1 | grep -v "^[WIE]1"
