#!/bin/bash
# Session 19, call d (on call c's warm machine, its /tmp/site kept): the flash-attention check,
# the 125M sweep with session 18's default-off options (forward_one_select,
# diagonal_causal_only, 128-row 8-warp tiles) and the table with the swept blocks.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 330 python3 -m experiments.benchmarks.flash_attention --parts check,sweep,table \
    --shapes 125m --sweep-seconds 120 --skip xla,swa,mosaic,f16 --out $OUT/fa.json > $OUT/fa.log 2>&1
echo "fa rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/fa.log | cut -c1-220 | tail -60
