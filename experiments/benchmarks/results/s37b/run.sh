#!/bin/bash
# Session 37, call b (carry .whl): gdn-130m's forward alone at three V tiles (s37b/prefill.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 experiments/benchmarks/results/s37b/prefill.py --dim 64 \
    --field value_block --tiles 64,32,16 --shapes 12x1x32768,12x2x16384,12x4x8192,12x8x4096 2>&1 | grep -v "^[WIE]1"
