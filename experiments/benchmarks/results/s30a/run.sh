#!/bin/bash
# Session 30, call a (carry .whl): flash attention's D 64 sweep with the CALLS timing of
# d1f9dc7 (s26d's single-call times spread 10–30 %), five rounds, and the table with the picks.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; mkdir -p $OUT
timeout 560 python3 -m experiments.benchmarks.flash_attention --parts sweep,table --shapes 125m \
    --rounds 5 --skip xla --out $OUT/flash.json > $OUT/flash.log 2>&1
echo rc=$?; grep -v "^W12\|^I12\|^E12\|^{" $OUT/flash.log | tail -40 | cut -c1-200
