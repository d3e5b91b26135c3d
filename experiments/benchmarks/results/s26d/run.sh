#!/bin/bash
# Session 26, call d (not run: no device lent after call c; for the next session): the flash-
# attention sweep at transformer-125m's shapes with each variant timed 5 times in turns
# (--rounds; call a's one-shot leads first in SWEEP_VARIANTS[64]), then the table with the
# swept blocks beside the defaults (fwd+bwd), to decide issue 14's D 64 defaults.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
timeout 500 python3 -m experiments.benchmarks.flash_attention --parts sweep,table --shapes 125m \
    --sweep-seconds 60 --rounds 5 --skip xla --out $OUT/fa_rounds.json > $OUT/logs/fa.log 2>&1
echo "fa rc=$?"; filt < $OUT/logs/fa.log | grep -v "^{" | tail -40 | cut -c1-220
cd $OUT && tar czf logs.tgz logs && rm -rf logs
