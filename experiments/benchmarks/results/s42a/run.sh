#!/bin/bash
# Session 42 (carry .whl, .devdata), two calls on one H100: issue 14's transformer-125m row
# against the PyTorch peer (s33b's command, a regression check after sessions 38-42's loss,
# optimizer and document-numbering changes), then every kernel's GPU check (gpu_checks.sh).
bash experiments/benchmarks/results/s33b/run.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
OUT=$OUT/checks timeout 200 bash experiments/benchmarks/gpu_checks.sh logit_stats rms_norm
# second call:
OUT=$OUT ARCHIVE=1 timeout 540 bash experiments/benchmarks/gpu_checks.sh short_conv ssd delta_rule nha flash_attention
