#!/bin/bash
# Session 30, call c (carry .whl): the GPU check (bf16 against the float32 reference with
# segment ids, D 64/128/256, GQA, windows) with s30b's D 64 defaults.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; mkdir -p $OUT
timeout 300 python3 -m experiments.benchmarks.flash_attention --parts check --out $OUT/check.json \
    > $OUT/check.log 2>&1
echo rc=$?; grep -v "^W12\|^I12\|^E12\|^{" $OUT/check.log | tail -8 | cut -c1-220
