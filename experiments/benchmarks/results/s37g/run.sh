#!/bin/bash
# Session 37, call g (carry .whl): K 128's forward alone at V 32 / 64 (prefill.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 experiments/benchmarks/results/s37g/prefill.py 2>&1 | grep -v "^[WIE]1"
