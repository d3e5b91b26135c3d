#!/bin/bash
# Session 44, call b (carry .whl, .devdata), one H100: after the attention pallas rung began
# naming the flash kernels (implementation="gpu") and their entry point defaulting by
# pallas_kernels.target, issue 14's transformer-125m row on packed text (s33b's command: its
# segment ids take the flash kernel) and the flash kernel's GPU check.
bash experiments/benchmarks/results/s33b/run.sh
export PYTHONPATH=/tmp/site:$PWD
OUT=$OUT/checks timeout 220 bash experiments/benchmarks/gpu_checks.sh flash_attention
