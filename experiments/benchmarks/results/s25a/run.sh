#!/bin/bash
# Session 25, call a: the 340M rows at T 8192 with session 23's loss kernel (never run), and the
# flash-attention forward sweep at 125m (forward_one_select's GPU values after MASK_VALUE -2^100).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
timeout 95 python3 -m experiments.benchmarks.flash_attention --parts sweep --shapes 125m \
    --sweep-seconds 45 --out $OUT/fa_sweep.json > $OUT/logs/fa_sweep.log 2>&1
echo "fa sweep rc=$?"; filt < $OUT/logs/fa_sweep.log | grep -i "forward\|BlockSizes" | cut -c1-200 | tail -22
timeout 370 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m \
    --torch "" --unpacked "" --steps 4 --remat none --time-limit 340 \
    --out $OUT/tt340.json > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | tail -14 | cut -c1-240
cd $OUT && tar czf logs.tgz logs && rm -rf logs
