#!/bin/bash
# Session 26, call a: the 340M rows at T 8192 (session 25's pending s25a), then the
# flash-attention sweep at 125m shapes (forward_one_select after MASK_VALUE -2^100).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
timeout 330 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m \
    --torch "" --unpacked "" --steps 4 --remat none --time-limit 300 \
    --out $OUT/tt340.json > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | tail -14 | cut -c1-240
timeout 200 python3 -m experiments.benchmarks.flash_attention --parts sweep --shapes 125m \
    --sweep-seconds 45 --out $OUT/fa_sweep.json > $OUT/logs/fa.log 2>&1
echo "fa rc=$?"; filt < $OUT/logs/fa.log | tail -30 | cut -c1-240
cd $OUT && tar czf logs.tgz logs && rm -rf logs
