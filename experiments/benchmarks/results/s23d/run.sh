#!/bin/bash
# Session 23, call d: the logit-statistics kernel's check and table at its final defaults
# (512 columns), then transformer-350m and nha-hybrid-340m at T 8192 on packed WikiText-2.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
timeout 120 python3 -m experiments.benchmarks.logit_stats --parts check,table \
    --variants '1024 columns;8 warps' --out $OUT/logit_stats.json > $OUT/logit_stats.log 2>&1
filt < $OUT/logit_stats.log | grep -v "^rows" | tail -12
timeout 330 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,nha-hybrid-340m --torch "" --unpacked "" --steps 4 \
    --remat none --out $OUT/tt_350m.json > $OUT/tt_350m.log 2>&1
echo "rows rc=$?"; filt < $OUT/tt_350m.log | grep "^model\|^transformer-350m \|^nha-hybrid-340m " | cut -c1-200
