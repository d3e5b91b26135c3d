#!/bin/bash
# Session 36, call f (carry .whl): the forward alone at few programs (prefill.py's docstring).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 experiments/benchmarks/results/s36f/prefill.py 2>&1 | grep -v "^[WIE]1"
