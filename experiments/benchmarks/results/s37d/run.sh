#!/bin/bash
# Session 37, call d (carry .whl): the delta_rule GPU check with the forward-alone tiles below
# K 128 that calls b and c measured (V 16 below 32 programs of 64 columns, V 32 up to 64).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
OUT=$OUT bash experiments/benchmarks/gpu_checks.sh delta_rule
